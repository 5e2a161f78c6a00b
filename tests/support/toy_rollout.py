"""A toy rollout kind, added to the rollout table by tests/controller/test_toy_rollout_kind.py: its class below plus
one row (`TOY`). Each batch is one `generate_turn` call on the policy's turn generator, and the kind
brings its own reward (the share of a response's tokens with an even id), so no reward function runs."""

from __future__ import annotations

import numpy as np

from rlctl.rollouts.single import decode_responses, join_rounds
from rlctl.rollouts.table import RolloutKind
from rlctl.runtime.batch import Batch, object_array
from rlctl.runtime.policy import rollout_batch


class EvenTokens:
    """rlctl.rollouts.base.Rollout over a turn generator."""

    def __init__(self, turns, ctx):
        self.turns, self.config, self.pad = turns, ctx.config, ctx.pad_id

    def generate(self, batch: Batch, *, seed: int, mode: str = "train") -> Batch:
        rc, width = self.config.rollout, self.config.data.max_response_length
        n = {"train": rc.n, "val": rc.val_n, "greedy": 1}[mode]
        limits = np.full(len(batch), width, dtype=np.int64)
        turn = Batch({"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"],
                      "max_new_tokens": limits})
        out = self.turns.generate_turn(turn, seed=seed, mode=mode, n=n, width=width)
        lengths = out["response_length"]
        return rollout_batch(batch, {"responses": out["responses"], "response_length": lengths,
                                     "response_mask": np.arange(width)[None, :] < lengths[:, None],
                                     "truncated": out["truncated"]},
                             n, width=self.config.data.max_prompt_length, pad=self.pad)

    def score(self, batch: Batch, reward, tokenizer, components: tuple = ()) -> dict:
        mask = batch["response_mask"] > 0
        even = ((batch["responses"] % 2 == 0) & mask).sum(1) / np.maximum(mask.sum(1), 1)
        batch["scores"] = even.astype(np.float32)
        batch["acc"] = (even > 0.5).astype(np.float32)
        batch["response_text"] = object_array(decode_responses(batch, tokenizer))
        return {"toy/even_share": float(even.mean())}

    def sample_rows(self, batch: Batch) -> np.ndarray:
        return np.arange(len(batch))

    def watch(self, step: int, batch: Batch, say) -> None:
        """Nothing to tell."""

    def record_fields(self, batch: Batch, r: int) -> dict:
        return {}

    def join_groups(self, rounds: list[Batch], groups: int, world_size: int) -> Batch:
        return join_rounds(rounds, groups, self.config.rollout.n, world_size)

    @property
    def prompt_tools(self) -> list[dict]:
        return []

    def eval_samples(self, batch: Batch, tokenizer) -> list[tuple[dict, dict]]:
        return [({"data_source": ds, "solution_str": text, "ground_truth": gt, "extra_info": ei, "prompt_str": "",
                  "messages": m}, {})
                for ds, text, gt, ei, m in zip(batch["data_source"], decode_responses(batch, tokenizer),
                                               batch["ground_truth"], batch["extra_info"], batch["messages"])]

    def close(self) -> None:
        """Nothing of its own."""


TOY = RolloutKind("toy", "support.toy_rollout:EvenTokens", "toy rollouts", "run.name",
                  lambda c: c.run.name == "toy-rollout", modes=("sync",), one_call=False, partial=False,
                  own_reward=lambda c: True)
