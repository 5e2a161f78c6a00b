"""reward.model as a reward source: the controller's side of the reward-model worker group.

The workers (rlctl.workers.roles.reward_model) render each chat with the reward model's own tokenizer;
here we only ship the prompt messages and the response text to them, split over their ranks.
"""

from __future__ import annotations

import numpy as np

from rlctl.runtime.batch import Batch, object_array


class RewardModelSource:
    name = "model"

    def __init__(self, handle, path: str):
        self.handle, self.path = handle, path

    def score(self, items: list[dict]) -> tuple[np.ndarray, dict[int, str]]:
        """Scores [N]; a reward model either scores the whole batch or its worker error stops the run."""
        batch = Batch({"messages": object_array([it.get("messages") or _fallback(it) for it in items]),
                       "response_text": object_array([it["solution_str"] for it in items])})
        return np.asarray(self.handle.compute_rm_scores(batch)["rm_scores"], dtype=np.float32), {}


def _fallback(item: dict) -> list[dict]:
    """No chat messages known (a greedy-baseline batch): the rendered prompt as the user turn."""
    return [{"role": "user", "content": item.get("prompt_str", "")}]
