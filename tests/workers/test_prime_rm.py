"""PRIME's implicit PRM on one rank, in this process (no Ray): at the start it equals its reference
(process rewards 0, BCE ln 2); its update moves the PRM, never the reference, and lowers its loss."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from rlctl.runtime.batch import Batch
from tests.workers.worker_fixtures import ragged_batch, run_config


def prm_batch() -> Batch:
    data = ragged_batch(rows=8)
    data["prm_label"] = np.array([1, 0, 0, 1, 0, 1, 1, 0], dtype=np.float32)
    return Batch(data, {"mini_batches": 1})


def test_the_prm_starts_as_its_reference_and_learns_alone(tiny_model_dir):
    from rlctl.workers.roles.prime_rm import ImplicitPRMWorker

    cfg = run_config(tiny_model_dir, algorithm={"name": "prime"})
    cfg = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm,
                                                                 params={"prm_lr": 1e-2, "beta_train": 0.5}))
    worker = ImplicitPRMWorker(cfg, total_steps=10)
    batch = prm_batch()
    assert np.array_equal(worker.compute_rm_scores(batch)["rm_scores"], np.zeros((8, 5), dtype=np.float32))
    ref_before = {k: v.clone() for k, v in worker.ref.module.state_dict().items()}
    prm_before = {k: v.clone() for k, v in worker.prm.module.state_dict().items()}
    losses = [worker.update_prm(batch)["prm/loss"] for _ in range(6)]
    assert losses[0] == pytest.approx(math.log(2.0), abs=1e-6)   # the first step's forward: PRM = reference
    assert losses[-1] < losses[0] - 1e-3                           # the BCE falls on its own labels
    assert all(torch.equal(v, ref_before[k]) for k, v in worker.ref.module.state_dict().items())
    assert any(not torch.equal(v, prm_before[k]) for k, v in worker.prm.module.state_dict().items())
    scores = worker.compute_rm_scores(batch)["rm_scores"]
    mask = batch["response_mask"] > 0
    assert np.all(scores[~mask] == 0) and np.abs(scores[mask]).max() > 0
    sums = scores.sum(-1)[mask.any(-1)]
    labels = batch["prm_label"][mask.any(-1)]
    assert sums[labels == 1].mean() > sums[labels == 0].mean()   # right answers now score higher


def test_a_score_label_outside_zero_one_stops_in_one_line():
    from rlctl.controller.prime import labels
    from rlctl.errors import RewardError

    batch = Batch({"acc": np.array([1.0, 0.0]), "scores": np.array([0.5, 1.5])})
    assert labels(batch, "acc").tolist() == [1.0, 0.0]
    with pytest.raises(RewardError, match="1.5, outside"):
        labels(batch, "score")


def test_validate_refuses_what_the_prm_is_not_built_for():
    from rlctl.config.checks import CheckContext
    from rlctl.config.schema import Config
    from rlctl.workers.roles.prime_checks import check_prime

    def keys(name, **rollout):
        c = Config()
        c = dataclasses.replace(c, algorithm=dataclasses.replace(c.algorithm, name=name),
                                rollout=dataclasses.replace(c.rollout, **rollout))
        return [p.key for p in check_prime(c, CheckContext(base_dir=None, raw={}))]

    assert keys("prime") == [] and keys("grpo", mode="async") == []
    assert keys("prime", mode="async") == ["rollout.mode"]
    assert keys("prime", mode="one_step_off") == ["rollout.mode"]


def test_validate_refuses_a_vision_language_model(tmp_path):
    import json

    from rlctl.config.checks import CheckContext
    from rlctl.config.schema import Config, ModelConfig
    from rlctl.workers.roles.prime_checks import check_prime_model

    for name, extra in (("text", {}), ("vlm", {"vision_config": {"depth": 1}})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"model_type": "qwen2", **extra}))

    def keys(folder, algo="prime"):
        c = Config(model=ModelConfig(path=folder))
        c = dataclasses.replace(c, algorithm=dataclasses.replace(c.algorithm, name=algo))
        return [p.key for p in check_prime_model(c, CheckContext(base_dir=tmp_path, raw={}, machine=True))]

    assert keys("text") == [] and keys("vlm", "grpo") == []
    assert keys("vlm") == ["algorithm.name"]


@pytest.mark.parametrize("update", ["before", "after", "none"])
def test_the_controller_orders_update_and_scoring(tiny_model_dir, update):
    """rlctl.controller.prime.process_rewards with the worker called in this process: "after" and "none"
    score with the PRM as it starts (equal to its reference: every process reward 0), "before" with the
    PRM its update just moved; "none" never trains it."""
    from rlctl.controller.prime import process_rewards
    from rlctl.workers.roles.prime_rm import ImplicitPRMWorker

    cfg = run_config(tiny_model_dir, algorithm={"name": "prime"})
    cfg = dataclasses.replace(cfg, algorithm=dataclasses.replace(cfg.algorithm, params={
        "prm_lr": 1e-2, "beta_train": 0.5, "prm_update": update}))
    data = ragged_batch(rows=8)
    data.update(acc=np.array([1, 0, 0, 1, 0, 1, 1, 0], dtype=np.float32), scores=np.zeros(8, dtype=np.float32))
    batch, metrics = process_rewards(Batch(data, {"mini_batches": 1}), cfg, ImplicitPRMWorker(cfg, total_steps=4))
    assert batch["prm_label"].tolist() == data["acc"].tolist()
    moved = bool(np.abs(batch["rm_scores"]).max() > 0)
    assert moved == (update == "before")
    assert ("prm/loss" in metrics) == (update != "none")
    assert metrics["prm/process_reward_mean"] == pytest.approx(float(batch["rm_scores"].sum(-1).mean()), abs=1e-6)
