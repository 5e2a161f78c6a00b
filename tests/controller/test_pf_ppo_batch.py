"""PF-PPO in the controller: the batch after the advantages is each prompt's rows resampled by
score, every column indexed alike; validate refuses the settings under which it would do nothing."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from rlctl.algorithms.kl import FixedKLController
from rlctl.config.checks import CheckContext
from rlctl.config.loader import load_config
from rlctl.config.schema import Config
from rlctl.controller.advantage import compute_advantages, policy_filtration
from rlctl.runtime.batch import Batch
from rlctl.validate.training import check_pf_ppo


def pf_config(method="pow", **algo) -> Config:
    base = Config()
    pf = dataclasses.replace(base.algorithm.pf_ppo, reweight_method=method)
    return dataclasses.replace(base, algorithm=dataclasses.replace(base.algorithm, use_pf_ppo=True, pf_ppo=pf, **algo),
                               rollout=dataclasses.replace(base.rollout, n=4))


def test_rows_stay_aligned_and_only_scored_rows_train():
    uid = np.empty(8, dtype=object)
    uid[:] = ["a", "b"] * 4
    batch = Batch({"response_mask": np.ones((8, 3), dtype=np.float32), "uid": uid,
                   "scores": np.array([0, 0, 0, 1, 1, 0, 1, 0], dtype=np.float32),
                   "row": np.arange(8), "tokens": np.arange(24).reshape(8, 3)})
    config = pf_config("pow")
    compute_advantages(batch, config, FixedKLController(0.0))
    before = {k: batch[k].copy() for k in batch.keys()}
    out, metrics = policy_filtration(batch, config, seed=3)
    rows = out["row"]
    assert set(rows[[0, 2, 4, 6]]) <= {4, 6} and set(rows[[1, 3, 5, 7]]) == {3}   # a: rows 4, 6; b: row 3
    for key, column in before.items():   # every column (advantages, uid, ...) taken from the same rows
        np.testing.assert_array_equal(out[key], column[rows])
    assert metrics["pf_ppo/score_mean"] == 1.0 and metrics["pf_ppo/unique_frac"] <= 3 / 8
    again, _ = policy_filtration(batch, config, seed=3)
    np.testing.assert_array_equal(again["row"], rows)   # a pure function of the step's seed


def problems(config, raw=None):
    return [(p.key, p.severity, p.message) for p in check_pf_ppo(config, CheckContext(base_dir=None, raw=raw or {}))]


def test_validate_refuses_what_pf_ppo_would_ignore():
    base = pf_config()
    one = dataclasses.replace(base, rollout=dataclasses.replace(base.rollout, n=1))
    [(key, severity, message)] = problems(one)
    assert key == "algorithm.use_pf_ppo" and severity == "error" and "nothing would be filtered" in message
    two = pf_config("max_min")
    two = dataclasses.replace(two, rollout=dataclasses.replace(two.rollout, n=2))
    assert problems(two)[0][0] == "algorithm.pf_ppo.reweight_method"
    assert problems(dataclasses.replace(two, rollout=dataclasses.replace(two.rollout, n=3))) == []
    spin = pf_config(name="spin")
    assert "break the reference/generation pairs" in problems(spin)[0][2]
    assert problems(base) == [] and base.rollout.n >= 2
    off = Config()
    assert problems(off, raw={"algorithm": {"pf_ppo": {"weight_pow": 1.0}}})[0][1] == "warning"
    assert problems(off) == []


def test_the_keys_load_with_verls_names():
    loaded = load_config(None, ["algorithm.use_pf_ppo=true", "algorithm.pf_ppo.reweight_method=max_random",
                                "algorithm.pf_ppo.weight_pow=1.5"], strict=False)
    pf = loaded.config.algorithm.pf_ppo
    assert loaded.config.algorithm.use_pf_ppo and (pf.reweight_method, pf.weight_pow) == ("max_random", 1.5)
    bad = load_config(None, ["algorithm.pf_ppo.reweight_method=best"], strict=False)
    assert any(p.key == "algorithm.pf_ppo.reweight_method" for p in bad.problems)


@pytest.mark.slow
def test_a_run_trains_on_the_filtered_batch(tmp_path, make_project, ray_cluster):
    import json

    from rlctl.controller.run import start_training
    from support.dense_reward import DENSE_REWARD, ONE_DENSE_STEP

    proj = make_project(tmp_path, "grpo-gsm8k")
    (proj / "dense.py").write_text(DENSE_REWARD)
    overrides = [*ONE_DENSE_STEP, "algorithm.use_pf_ppo=true", "algorithm.pf_ppo.reweight_method=max_min"]
    start_training(load_config(proj / "rlctl.toml", overrides), address=None, force=False)
    [row] = [json.loads(line) for line in (proj / "runs" / "grpo-gsm8k" / "metrics.jsonl").read_text().splitlines()]
    assert 0 < row["pf_ppo/unique_frac"] <= 1 and "actor/pg_loss" in row
