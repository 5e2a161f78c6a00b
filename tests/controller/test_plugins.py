"""A project's own estimator and policy loss (`algorithm.plugins`), selected by name in rlctl.toml:
validated, imported by the controller and by the Ray actor ranks, and used for training."""

from __future__ import annotations

import json
import uuid

import pytest

from rlctl.config.loader import load_config
from rlctl.validate import validate
from rlctl.controller.run import start_training
from support.dense_reward import DENSE_REWARD

PLUGIN = '''
import torch
from rlctl.algorithms import aggregate_loss, register_estimator, register_policy_loss

@register_estimator("max_baseline_{tag}", needs_group=True)
def max_baseline(*, token_level_rewards, response_mask, group_ids, **_):
    scores = token_level_rewards.sum(-1)
    best = {{g: max(s for s, h in zip(scores.tolist(), group_ids) if h == g) for g in group_ids}}
    adv = (scores - torch.tensor([best[g] for g in group_ids])).unsqueeze(-1) * response_mask
    return adv, adv

@register_policy_loss("reinforce_{tag}")
def reinforce(*, log_prob, advantages, response_mask, loss_agg_mode, norm, **_):
    loss = aggregate_loss(-advantages * log_prob, response_mask, loss_agg_mode, norm=norm)
    return loss, {{"plugin_loss_calls": 1.0}}
'''


def plugin_project(make_project, tmp_path):
    tag = uuid.uuid4().hex[:8]   # registries are per process: every test registers its own names
    proj = make_project(tmp_path, "grpo-gsm8k")
    (proj / "algos.py").write_text(PLUGIN.format(tag=tag))
    (proj / "dense.py").write_text(DENSE_REWARD)
    return proj, tag


COMMON = ["resources.gpus_per_node=0", "resources.workers=1", "data.max_response_length=8",
          "data.max_prompt_length=96", "data.val_files=[]", 'data.train_files=["data/arith/train.parquet"]',
          "model.dtype=float32", "model.gradient_checkpointing=false", "run.save_every=0",
          "reward.function=dense.py:compute_score", "reward.workers=1", "data.batch_size=4", "rollout.n=4",
          "actor.mini_batch_size=4", "actor.micro_batch_size=16", "run.total_steps=2"]


def errors_of(proj, *overrides):
    problems, _ = validate(load_config(proj / "rlctl.toml", COMMON + list(overrides)), machine=True)
    return [f"{p.key}: {p.message}" for p in problems if p.severity == "error"]


def test_plugin_names_validate_and_unknown_names_are_errors(tmp_path, make_project):
    proj, tag = plugin_project(make_project, tmp_path)
    chosen = ['algorithm.plugins=["algos.py"]', f"algorithm.name=max_baseline_{tag}",
              f"actor.policy_loss=reinforce_{tag}"]
    assert errors_of(proj, *chosen) == []
    errors = errors_of(proj, *chosen[:1], f"algorithm.name=max_baseline_{tag}x")
    assert len(errors) == 1 and f"did you mean 'max_baseline_{tag}'" in errors[0]
    errors = errors_of(proj, "actor.policy_loss=nowhere")   # (other tests in this process may register more)
    assert len(errors) == 1 and errors[0].startswith("actor.policy_loss: 'nowhere' is not a registered name (vanilla")
    assert f"reinforce_{tag}" in errors[0] and errors[0].endswith("register your own in a file listed in algorithm.plugins")
    (proj / "broken.py").write_text("def oops(:\n")
    errors = errors_of(proj, 'algorithm.plugins=["broken.py", "missing.py"]')
    assert errors == [f"algorithm.plugins: syntax error in {proj / 'broken.py'} line 1: invalid syntax"]


@pytest.mark.slow
def test_training_runs_the_plugin_estimator_and_loss(tmp_path, make_project, ray_cluster):
    proj, tag = plugin_project(make_project, tmp_path)
    overrides = COMMON + ['algorithm.plugins=["algos.py"]', f"algorithm.name=max_baseline_{tag}",
                          f"actor.policy_loss=reinforce_{tag}"]
    start_training(load_config(proj / "rlctl.toml", overrides), address=None, force=False)
    rows = [json.loads(line) for line in (proj / "runs" / "grpo-gsm8k" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["critic/advantages/max"] <= 0 for r in rows)      # max baseline: nobody beats the best
    assert all(r["actor/plugin_loss_calls"] == 1.0 for r in rows)   # the loss ran in the Ray actor rank
