"""The single-turn kind: one `generate` call on the policy's group samples every response, and the
reward function scores the decoded text (what the other kinds share: `score_samples`, `join_rounds`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from rlctl.runtime.batch import Batch, object_array

if TYPE_CHECKING:
    from rlctl.rollouts.base import RolloutContext


class SingleTurn:
    """rlctl.rollouts.base.Rollout: the group's own `generate` RPC (prompt i's n samples are rows
    i*n .. i*n+n-1)."""

    def __init__(self, turns, ctx: RolloutContext):
        self.turns, self.n = turns, ctx.config.rollout.n

    def generate(self, batch: Batch, *, seed: int, mode: str = "train") -> Batch:
        return self.turns.generate(batch, seed=seed, mode=mode)

    def score(self, batch: Batch, reward, tokenizer, components: tuple = ()) -> dict:
        return score_samples(batch, reward, tokenizer, components)

    def sample_rows(self, batch: Batch) -> np.ndarray:
        return np.arange(len(batch))

    def watch(self, step: int, batch: Batch, say) -> None:
        """Nothing of its own to tell about a training batch."""

    @staticmethod
    def record_fields(batch: Batch, r: int) -> dict:
        return {}   # the dump's own: the prompt and the decoded response as `messages`

    def join_groups(self, rounds: list[Batch], groups: int, world_size: int) -> Batch:
        return join_rounds(rounds, groups, self.n, world_size)

    @property
    def prompt_tools(self) -> list[dict]:
        return []

    def close(self) -> None:
        """Nothing of its own: the group belongs to the run."""


def join_rounds(rounds: list[Batch], groups: int, n: int, world_size: int) -> Batch:
    """The first `groups` groups of n rows each, as many as every worker can train the same number of rows of."""
    while groups > 1 and (groups * n) % world_size:
        groups -= 1
    return Batch.concat(rounds).slice(0, groups * n)


def score_samples(batch: Batch, reward_runner, tokenizer, components: tuple = (),
                  extra_info: list | None = None) -> dict:
    """Decode responses, score them, store `scores` (+ `acc` and extras); return reward metrics.

    components: names of numeric extras of the reward's dict that the estimator reads (gdpo); each
    is stored as `reward_component/<name>` [B] and must be present for every sample. extra_info: each
    row's reward extra_info in place of the row's own (multi-turn: the conversation's)."""
    texts = decode_responses(batch, tokenizer)
    prompts = decode_prompts(batch, tokenizer)
    messages = batch["messages"] if "messages" in batch else [None] * len(texts)
    infos = extra_info if extra_info is not None else batch["extra_info"]
    items = [{"data_source": ds, "solution_str": t, "ground_truth": gt, "extra_info": ei, "prompt_str": p,
              "messages": m}
             for ds, t, gt, ei, p, m in zip(batch["data_source"], texts, batch["ground_truth"], infos, prompts,
                                            messages)]
    result = reward_runner.score(items)
    batch["scores"] = result.scores.astype(np.float32)
    acc = result.extras.get("acc")
    batch["acc"] = (np.nan_to_num(acc, nan=0.0) if acc is not None else (result.scores > 0)).astype(np.float32)
    batch["response_text"] = object_array(texts)
    for name in components:
        values = result.extras.get(name)
        missing = len(texts) if values is None else int(np.isnan(values).sum())
        if missing:
            from rlctl.errors import RewardError

            raise RewardError(f"the reward function returned no numeric {name!r} for {missing} of {len(texts)} "
                              "samples, and algorithm.params.reward_keys lists it",
                              hint=f"return a dict with {name!r} for every sample, or remove it from the keys")
        batch[f"reward_component/{name}"] = values.astype(np.float32)
    return dict(result.metrics)


def decode_responses(batch: Batch, tokenizer) -> list[str]:
    responses, lengths = batch["responses"], batch["response_length"]
    return tokenizer.batch_decode([row[:n].tolist() for row, n in zip(responses, lengths)],
                                  skip_special_tokens=True)


def decode_prompts(batch: Batch, tokenizer) -> list[str]:
    """The chat-templated prompts as the policy saw them (special tokens kept, padding dropped)."""
    width = batch["prompts"].shape[1]
    return tokenizer.batch_decode([row[m != 0].tolist() for row, m in
                                   zip(batch["prompts"], batch["attention_mask"][:, :width])])
