"""Failed agent episodes, said out loud: each one's reason on its rows (`agent_failure`, which samples.jsonl,
the rollouts dump and `rlctl view` show), one console line per step with each distinct reason and its count,
and a run whose every episode failed for MAX_FAILED_STEPS steps in a row stopped (exit 5, a reward abort)
instead of training on nothing.
"""

from __future__ import annotations

from collections import Counter

from rlctl.agent.episodes import CONTEXT_LENGTH

MAX_FAILED_STEPS = 3
CONTEXT_REASON = ("a call did not fit its sequence (HTTP 400 context_length_exceeded): raise "
                  "data.max_prompt_length (the first call's prompt, tool schemas included) or data.max_response_length")
SHOWN = 160   # characters of a reason on the console line


def failure_text(failure: str, refused: str) -> str:
    """An episode's reason as its rows carry it: a refusal of the endpoint the agent did not survive names the
    config keys to raise, with what the agent reported after it."""
    if failure and refused == CONTEXT_LENGTH:
        return f"{CONTEXT_REASON}; the agent then {failure}"
    return failure


def reason(text: str) -> str:
    """The part of a failure that names its kind: counted together on the console line."""
    if text.startswith(CONTEXT_REASON):
        return CONTEXT_REASON
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= SHOWN else one_line[:SHOWN - 3] + "..."


def failure_counts(failures) -> Counter:
    """{reason: episodes} of a rollout's episodes' failures (one each, "" when it did not fail)."""
    return Counter(reason(str(f)) for f in failures if f)


def failure_line(counts: Counter, episodes: int) -> str:
    """`N of M agent episodes failed: reason (xK); ...`, the most frequent reason first."""
    failed = sum(counts.values())
    listed = "; ".join(f"{why} (x{k})" for why, k in counts.most_common())
    return f"{failed} of {episodes} agent episodes failed: {listed}"


class FailureWatch:
    """Tells the console about each step's failed episodes and stops the run after MAX_FAILED_STEPS steps
    in a row in which every episode failed."""

    def __init__(self, say):
        self.say, self.streak, self.reasons = say, 0, Counter()

    def step(self, step: int, failures) -> None:
        """`failures`: the step's episodes' agent_failure, one each."""
        counts, episodes = failure_counts(failures), len(failures)
        if not counts:
            self.streak, self.reasons = 0, Counter()
            return
        self.say(f"step {step}: {failure_line(counts, episodes)}")
        every = sum(counts.values()) == episodes
        self.streak = self.streak + 1 if every else 0
        self.reasons = self.reasons + counts if every else Counter()
        if self.streak >= MAX_FAILED_STEPS:
            from rlctl.errors import RewardError

            raise RewardError(f"every agent episode failed in {self.streak} steps in a row (steps "
                              f"{step - self.streak + 1}-{step}), so there is nothing to train on: "
                              f"{failure_line(self.reasons, sum(self.reasons.values()))}",
                              hint="fix what the reasons name (each failed sample's reason is in samples.jsonl "
                                   "and `rlctl view`)")
