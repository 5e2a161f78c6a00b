"""When rollout.mode = "async" generates, pushes weights and drops: a pure function of counts.

The rollout group runs its calls in the order they were submitted, so the weights a generation
uses are those of the last push submitted before it. The schedule therefore decides everything
from counts the controller holds, never from timing: a run is the same however fast each
generation happens to be (what makes a resumed run and a K = 1 run equal to the uninterrupted and
the one_step_off run), while the trainer still takes each batch as soon as it is ready.

Counts are in groups (one prompt and its rollout.n samples); a generation call is one batch of
G = data.batch_size prompts, drawn from the prompt loader in order:

    issued = taken + dropped + filtered + pending
    (prompts drawn = trained + dropped as stale + filtered by dynamic sampling + in flight or buffered)

A group generated with the weights of update v and trained at step s is (s - 1) - v updates stale:
step s trains the weights of update s - 1. Staleness above K = rollout.max_staleness drops the
group, in either strategy. Weights are pushed after update s when s % rollout.sync_every == 0.
  "wait": a batch is issued only when its last group will be at most K stale if none is dropped:
          with b = (taken + pending) / G batches ahead of it, b - pushed <= K. Generation pauses
          until the trainer catches up, so nothing is dropped; K = 1, sync_every = 1 issues batch
          k + 1 right after update k - 1's push, which is one_step_off's order.
  "drop": the group keeps K + 1 batches in flight or buffered at all times (a refill as soon as a
          batch is taken or dropped), so it never waits for the trainer; what got too stale drops.
Either way only batches that can still be trained are issued (taken + pending < total_steps * G).
Progress needs sync_every <= K + 1 (rlctl.workers.rollout.checks): a batch issued just after a
push is then never more than K stale when it is trained next.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass
class AsyncSchedule:
    """The async source's counts and its rules; `state_dict` goes into each checkpoint."""

    max_staleness: int
    strategy: str          # "wait" | "drop"
    sync_every: int
    total_steps: int
    group_size: int        # G: prompts per training batch and per generation call (data.batch_size)
    issued: int = 0        # groups (prompts) drawn from the loader and sent to generate
    taken: int = 0         # groups the trainer took into a training batch
    dropped: int = 0       # groups dropped as too stale
    filtered: int = 0      # groups dynamic sampling filtered out (no spread in their metric)
    pushed: int = 0        # the version the rollout group holds once its queue has run (last push)

    @property
    def pending(self) -> int:
        """Groups issued and neither trained nor dropped: generating, or finished and buffered."""
        return self.issued - self.taken - self.dropped - self.filtered

    def may_issue(self) -> bool:
        """Whether one more generation call of G prompts goes to the rollout group now."""
        if self.taken + self.pending >= self.total_steps * self.group_size:
            return False   # every step still to train already has its groups coming
        if self.strategy == "drop":
            return self.pending < (self.max_staleness + 1) * self.group_size
        ahead = -(-(self.taken + self.pending) // self.group_size)   # batches before it, rounded up
        return ahead - self.pushed <= self.max_staleness

    def push_due(self, step: int) -> bool:
        """Push the weights of update `step` (nothing generates after the last update)."""
        return step % self.sync_every == 0 and step < self.total_steps

    def staleness(self, step: int, version):
        """Updates between the weights that generated (`version`, scalar or array) and step's."""
        return (step - 1) - version

    def too_stale(self, step: int, version) -> bool:
        return self.staleness(step, version) > self.max_staleness

    def state_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k in ("issued", "taken", "dropped", "filtered", "pushed")}

    def load_state_dict(self, state: dict) -> None:
        self.issued, self.taken = int(state["issued"]), int(state["taken"])
        self.dropped, self.filtered, self.pushed = int(state["dropped"]), int(state["filtered"]), int(state["pushed"])
