"""Where the trainer's batches come from: a `RolloutSource` (its contract:
rlctl.controller.setup.RolloutSource), chosen once at setup by rollout.mode.

    source.start(first_step)                  # once, after any restore
    batch, metrics = source.next(step)        # generated (and scored) for step
    ... old log-probs, advantages, updates ...
    timing = source.after_update(step)        # e.g. push the new weights to a separate rollout group

"sync" (`SyncRollout`): each step generates on the actor's own workers and scores the batch
(rlctl.controller.rollout.rollout, with dynamic sampling). "one_step_off"
(rlctl.controller.offpolicy.OneStepOff): a separate rollout group generates batch k+1 while the
actor trains on batch k. "async" (rlctl.controller.async_rollout.AsyncRollout): the rollout group
generates ahead continuously, up to rollout.max_staleness updates stale. A source also writes what it has in flight into a checkpoint (`save`) and
takes it back on resume (`restore`). Adding a mode: one module with a class like these and one
line in MODES (plus the choice in rlctl.config.schema.RolloutConfig.mode).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rlctl.controller import rollout
from rlctl.controller.async_rollout import AsyncRollout
from rlctl.controller.offpolicy import OneStepOff

if TYPE_CHECKING:
    from rlctl.controller.setup import RolloutSource, TrainSetup
    from rlctl.runtime.batch import Batch
    from rlctl.workers.roles.groups import Workers


class SyncRollout:
    """rollout.mode = "sync": generate on the actor's workers, then score, at every step."""

    on_policy = True

    def __init__(self, setup: TrainSetup, workers: Workers):
        self.setup = setup

    def start(self, first_step: int) -> None:
        """Nothing to prepare: the actor generates with the weights it holds."""

    def next(self, step: int) -> tuple[Batch, dict]:
        return rollout.rollout(self.setup, step)

    def after_update(self, step: int) -> dict:
        return {}   # the actor's own engine generates with the weights it just trained

    def save(self, folder: Path) -> None:
        """Nothing in flight: the next batch is generated when its step starts."""

    def restore(self, folder: Path) -> None:
        """Nothing to take back: generation seeds are a pure function of (seed, step, round)."""

    def close(self) -> None:
        """Nothing of its own to release: the workers belong to the run."""


# rollout.mode -> its source class, built with (setup, workers)
MODES = {"sync": SyncRollout, "one_step_off": OneStepOff, "async": AsyncRollout}


def rollout_source(setup: TrainSetup, workers: Workers) -> RolloutSource:
    """The source for the run's rollout.mode (MODES)."""
    return MODES[setup.config.rollout.mode](setup, workers)
