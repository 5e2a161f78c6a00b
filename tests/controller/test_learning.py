"""Proof that every recipe learns: a dense reward on the tiny model rises within a few dozen steps.

Real everything: the recipe's own TOML, Ray actors, the HF rollout engine, the reward process pool.
The reward is the share of lowercase ASCII letters in the response (about 10% for the random
byte-level model), so every group has signal from the first step.

Each run but GRPO's (tests/controller/test_resume.py has its own) then checks exact resume on itself,
instead of a separate short run: resumed from its step-22 checkpoint, it reproduces the uninterrupted
run's metrics rows and final weights bit for bit. DAPO (dynamic sampling) and PPO (adaptive KL in the
reward, the controller state a checkpoint must carry) run on 2 ranks, so DCP saves and loads shards.
"""

from __future__ import annotations

import json

import pytest
from test_resume import check_resume_reproduces

from rlctl.config.loader import load_config
from rlctl.controller.run import start_training
from support.dense_reward import DENSE_REWARD


COMMON = ["resources.gpus_per_node=0", "resources.workers=1", "data.max_response_length=8",
          "data.max_prompt_length=96", "data.val_files=[]", 'data.train_files=["data/arith/train.parquet"]',
          "model.dtype=float32", "model.gradient_checkpointing=false", "run.save_every=0",
          "reward.function=dense.py:compute_score", "reward.workers=1", "actor.lr=3e-3", "actor.warmup_steps=0"]
GROUP = ["data.batch_size=8", "rollout.n=8", "actor.mini_batch_size=8", "actor.micro_batch_size=64"]
PER_RECIPE = {
    "grpo-gsm8k": GROUP,
    "dapo-gsm8k": GROUP + ["resources.workers=2", "actor.micro_batch_size=32", "reward.overlong.buffer_len=4",
                           "algorithm.dynamic_sampling.metric=score", "algorithm.dynamic_sampling.max_gen_batches=3"],
    "rloo-gsm8k": GROUP,
    "remax-gsm8k": ["data.batch_size=16", "rollout.n=4", "actor.mini_batch_size=16", "actor.micro_batch_size=64"],
    "reinforce-pp-gsm8k": ["data.batch_size=16", "rollout.n=4", "actor.mini_batch_size=16",
                           "actor.micro_batch_size=64"],
    "ppo-gsm8k": ["resources.workers=2", "algorithm.kl_ctrl=adaptive", "algorithm.kl_in_reward=true",
                  "data.batch_size=64", "rollout.n=1", "actor.mini_batch_size=64", "actor.micro_batch_size=32",
                  "critic.mini_batch_size=64", "critic.micro_batch_size=32", "critic.lr=1e-2"],
}
STEPS = 24
RESUME_AT = 22   # a checkpoint here (and at the end): resume recomputes 2 steps


@pytest.mark.slow
@pytest.mark.parametrize("recipe", sorted(PER_RECIPE))
def test_recipe_learns_dense_reward(recipe, tmp_path, make_project, ray_cluster):
    proj = make_project(tmp_path, recipe)
    (proj / "dense.py").write_text(DENSE_REWARD)
    resume = recipe != "grpo-gsm8k"
    overrides = COMMON + PER_RECIPE[recipe] + [f"run.total_steps={STEPS}"]
    overrides += [f"run.save_every={RESUME_AT}"] if resume else []
    start_training(load_config(proj / "rlctl.toml", overrides), address=None, force=False)
    run = proj / "runs" / recipe
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    rewards = [r["reward/mean"] for r in rows]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last > first + 0.05, f"{recipe}: reward {first:.3f} -> {last:.3f} ({[round(x, 3) for x in rewards]})"
    assert json.loads((run / "run.json").read_text())["status"] == "finished"
    if resume:
        check_resume_reproduces(run, RESUME_AT, tmp_path)
