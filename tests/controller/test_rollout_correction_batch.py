"""Rollout correction in the controller: a rejected (MIS) row leaves the loss, not the rewards.

GRPO's group baseline must see every sampled row's score; rejection only takes tokens out of
`response_mask` for the updates, after the advantages."""

from __future__ import annotations

import dataclasses

import numpy as np

from rlctl.algorithms.kl import FixedKLController
from rlctl.config.schema import Config
from rlctl.controller.advantage import apply_rollout_correction, compute_advantages
from rlctl.runtime.batch import Batch


def _batch(rollout_log_prob: np.ndarray) -> Batch:
    mask = np.ones((4, 3), dtype=np.float32)
    uid = np.empty(4, dtype=object)
    uid[:] = ["g", "g", "g", "g"]
    return Batch({"response_mask": mask, "scores": np.array([1, 1, 0, 0], dtype=np.float32),
                  "acc": np.zeros(4, dtype=np.float32), "response_length": np.full(4, 3),
                  "old_log_prob": np.zeros((4, 3), dtype=np.float32), "rollout_log_prob": rollout_log_prob,
                  "uid": uid})


def test_a_rejected_row_keeps_its_score_in_the_group_baseline():
    base = Config()
    correction = dataclasses.replace(base.algorithm.rollout_correction, rollout_rs="token_k1",
                                     rollout_rs_threshold="0.5_2.0")
    config = dataclasses.replace(base, algorithm=dataclasses.replace(base.algorithm, name="grpo",
                                                                     rollout_correction=correction))
    far = np.zeros((4, 3), dtype=np.float32)
    far[1] = 5.0   # row 1: ratio exp(-5), far below 0.5 on every token -> rejected whole
    rejected, plain = _batch(far), _batch(np.zeros((4, 3), dtype=np.float32))
    for batch in (rejected, plain):
        apply_rollout_correction(batch, config)
        compute_advantages(batch, config, FixedKLController(0.0))
    np.testing.assert_allclose(rejected["advantages"][[0, 2, 3]], plain["advantages"][[0, 2, 3]])
    assert plain["advantages"][0, 0] > 0.8   # +-0.866: scores [1, 1, 0, 0] normalised in one group
    np.testing.assert_array_equal(rejected["response_mask"][1], 0)    # no loss on the rejected row
    np.testing.assert_array_equal(rejected["response_mask"][[0, 2, 3]], 1)
