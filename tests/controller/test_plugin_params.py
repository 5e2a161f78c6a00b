"""A user's plugin estimator and plugin loss with parameters of their own, one file each: declared
as a frozen dataclass beside the function, set in [algorithm.params] / [actor.loss_params],
checked by validate (unknown key with did-you-mean, wrong type, all at once), and passed by the
controller and the worker without any code of rlctl naming them."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest
import torch

from rlctl import algorithms
from rlctl.algorithms import FixedKLController
from rlctl.config.loader import load_config
from rlctl.controller.advantage import compute_advantages
from rlctl.runtime.batch import Batch
from rlctl.validate import validate

ESTIMATOR = '''
from dataclasses import dataclass
from rlctl.algorithms import register_estimator

@dataclass(frozen=True)
class ScaledParams:
    scale: float = 1.0          # multiplies the centred score
    centre: bool = True         # subtract the group mean

@register_estimator("scaled_{tag}", needs_group=True, params=ScaledParams, reads=("response_length",))
def scaled(*, token_level_rewards, response_mask, group_ids, scale, centre, response_length, **_):
    scores = token_level_rewards.sum(-1)
    means = {{g: sum(s for s, h in zip(scores.tolist(), group_ids) if h == g) / group_ids.count(g)
              for g in group_ids}}
    base = scores - (scores.new_tensor([means[g] for g in group_ids]) if centre else 0.0)
    assert response_length.shape == scores.shape   # the declared column arrives, one value a row
    adv = (scale * base).unsqueeze(-1) * response_mask
    return adv, adv
'''

LOSS = '''
from dataclasses import dataclass
from rlctl.algorithms import aggregate_loss, register_policy_loss

@dataclass(frozen=True)
class WeightedParams:
    coef: float = 1.0

    def __post_init__(self):
        if self.coef <= 0:
            raise ValueError(f"coef must be > 0, got {{self.coef}}")

@register_policy_loss("weighted_pg_{tag}", params=WeightedParams)
def weighted_pg(*, log_prob, advantages, response_mask, loss_agg_mode, norm, coef, **_):
    loss = coef * aggregate_loss(-advantages * log_prob, response_mask, loss_agg_mode, norm=norm)
    return loss, {{"plugin_coef": coef}}
'''


@pytest.fixture
def plugin_project(tmp_path):
    tag = uuid.uuid4().hex[:8]   # registries are per process: every test registers its own names
    (tmp_path / "estimator.py").write_text(ESTIMATOR.format(tag=tag))
    (tmp_path / "loss.py").write_text(LOSS.format(tag=tag))
    (tmp_path / "rlctl.toml").write_text(f'''
[model]
path = "model"
[data]
train_files = ["train.parquet"]
[algorithm]
name = "scaled_{tag}"
plugins = ["estimator.py", "loss.py"]
[algorithm.params]
scale = 3.0
[actor]
policy_loss = "weighted_pg_{tag}"
[actor.loss_params]
coef = 0.5
''')
    return tmp_path, tag


def errors_of(proj, *overrides):
    problems, _ = validate(load_config(proj / "rlctl.toml", list(overrides), strict=False), machine=False)
    return [f"{p.key}: {p.message}" for p in problems if p.severity == "error"
            and p.key.startswith(("algorithm.params", "actor.loss_params"))]


def test_bad_parameters_are_refused_all_at_once(plugin_project):
    proj, tag = plugin_project
    assert errors_of(proj) == []
    errors = errors_of(proj, "algorithm.params.scal=2", 'algorithm.params.centre="yes"', "actor.loss_params.cof=1")
    assert errors == [
        f"algorithm.params.scal: unknown parameter of algorithm 'scaled_{tag}' (did you mean 'scale'?); known: "
        "scale, centre",
        f"algorithm.params.centre: algorithm 'scaled_{tag}': expected true or false, got str 'yes'",
        f"actor.loss_params.cof: unknown parameter of policy_loss 'weighted_pg_{tag}' (did you mean 'coef'?); "
        "known: coef"]
    assert errors_of(proj, "actor.loss_params.coef=-1") == [
        f"actor.loss_params: policy_loss 'weighted_pg_{tag}': coef must be > 0, got -1.0"]
    # a built-in loss without parameters refuses any
    assert errors_of(proj, "actor.policy_loss=vanilla") == [
        "actor.loss_params.coef: policy_loss 'vanilla' takes no parameters: remove it"]


def _batch() -> Batch:
    return Batch({"scores": np.array([1.0, 0.0, 0.0, 0.0], dtype=np.float32),
                  "response_mask": np.ones((4, 3), dtype=np.float32),
                  "response_length": np.full(4, 3, dtype=np.int64),
                  "uid": np.array(["a", "a", "b", "b"], dtype=object)})


def test_the_parameters_change_the_result(plugin_project):
    proj, _ = plugin_project
    results = {}
    for scale in (1, 3):
        loaded = load_config(proj / "rlctl.toml", [f"algorithm.params.scale={scale}"], strict=False)
        validate(loaded, machine=False)   # imports the plugins, as `rlctl train` does
        batch = _batch()
        compute_advantages(batch, loaded.config, FixedKLController(0.0))
        results[scale] = batch["advantages"]
    np.testing.assert_allclose(results[1][:, 0], [0.5, -0.5, 0.0, 0.0])
    np.testing.assert_allclose(results[3], 3 * results[1])
    losses = []
    for coef in (0.5, 2.0):   # the call the actor worker makes: the table passed as it is
        config = load_config(proj / "rlctl.toml", [f"actor.loss_params.coef={coef}"], strict=False).config
        log_prob = -torch.arange(1.0, 13.0).reshape(4, 3) / 4
        loss, metrics = algorithms.policy_loss(config.actor.policy_loss, old_log_prob=log_prob, log_prob=log_prob,
                                               advantages=torch.from_numpy(results[3]), response_mask=torch.ones(4, 3),
                                               params=config.actor.loss_params)
        losses.append(float(loss))
        assert metrics == {"plugin_coef": coef}
    assert losses[1] == pytest.approx(4 * losses[0]) and losses[0] != 0


@pytest.mark.slow
def test_a_run_passes_the_tables_to_the_plugins(tmp_path, make_project, ray_cluster):
    from support.dense_reward import DENSE_REWARD, ONE_DENSE_STEP
    from rlctl.controller.run import start_training

    tag = uuid.uuid4().hex[:8]
    proj = make_project(tmp_path, "grpo-gsm8k")
    (proj / "estimator.py").write_text(ESTIMATOR.format(tag=tag))
    (proj / "loss.py").write_text(LOSS.format(tag=tag))
    (proj / "dense.py").write_text(DENSE_REWARD)
    overrides = [*ONE_DENSE_STEP,
                 'algorithm.plugins=["estimator.py", "loss.py"]', f"algorithm.name=scaled_{tag}",
                 "algorithm.params.centre=false", f"actor.policy_loss=weighted_pg_{tag}", "actor.loss_params.coef=0.25"]
    start_training(load_config(proj / "rlctl.toml", overrides), address=None, force=False)
    [row] = [json.loads(line) for line in (proj / "runs" / "grpo-gsm8k" / "metrics.jsonl").read_text().splitlines()]
    assert row["actor/plugin_coef"] == 0.25                  # the loss's table reached the Ray actor rank
    assert row["critic/advantages/min"] >= 0                 # centre = false: the raw dense scores (>= 0)
