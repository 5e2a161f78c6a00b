"""Proof of learning through an interaction: examples/multiturn-feedback on the tiny random model.

The simulated user grades each answer and asks again with feedback; the reward is the last answer's
score. Real Ray actors, the hf engine, the reward pool; the example's own rlctl.toml and files.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlctl.config.loader import load_config
from rlctl.controller.run import start_training

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "multiturn-feedback"
STEPS = 30


@pytest.fixture(scope="module")
def arith_data(tmp_path_factory) -> Path:
    from rlctl.tasks.prep import PrepOptions, prepare

    root = tmp_path_factory.mktemp("arith")
    prepare("arith", PrepOptions(out=root))
    return root


@pytest.mark.slow
def test_reward_rises_with_a_feedback_interaction(tmp_path, tiny_model_dir, arith_data, ray_cluster):
    proj = Path(shutil.copytree(EXAMPLE, tmp_path / "example"))
    (proj / "models").mkdir()
    (proj / "models" / "tiny").symlink_to(tiny_model_dir)
    (proj / "data").mkdir()
    (proj / "data" / "arith").symlink_to(arith_data)
    start_training(load_config(proj / "rlctl.toml", [f"run.total_steps={STEPS}", "run.save_every=0"]),
                   address=None, force=False)
    run = proj / "runs" / "multiturn-feedback"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert rows[0]["multi_turn/turns/mean"] > 1.5, "the user asked again in most conversations"
    rewards = [r["reward/mean"] for r in rows]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last > first + 0.1, f"reward {first:.3f} -> {last:.3f} ({[round(x, 3) for x in rewards]})"
    record = json.loads((run / "rollouts" / f"step_{STEPS}.jsonl").read_text().splitlines()[0])
    roles = [m["role"] for m in record["messages"]]
    assert roles[:2] == ["user", "assistant"] and record["num_turns"] == roles.count("assistant")


@pytest.mark.slow
def test_reward_rises_one_step_off(tmp_path, tiny_model_dir, arith_data, ray_cluster):
    """rollout.mode = "one_step_off": the separate rollout group runs the conversations (the turn loop
    drives it from a thread) one update behind the actor, and the reward still rises."""
    proj = Path(shutil.copytree(EXAMPLE, tmp_path / "example"))
    (proj / "models").mkdir()
    (proj / "models" / "tiny").symlink_to(tiny_model_dir)
    (proj / "data").mkdir()
    (proj / "data" / "arith").symlink_to(arith_data)
    start_training(load_config(proj / "rlctl.toml", [
        f"run.total_steps={STEPS}", "run.save_every=0", "rollout.mode=one_step_off", "resources.workers=1",
        "resources.rollout_workers=1"]), address=None, force=False)
    rows = [json.loads(line) for line in (proj / "runs" / "multiturn-feedback" / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout/staleness"] for r in rows] == [0.0] + [1.0] * (STEPS - 1)
    assert all(r["multi_turn/turns/mean"] > 1.5 for r in rows[:3]), "the user asked again"
    rewards = [r["reward/mean"] for r in rows]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last > first + 0.1, f"reward {first:.3f} -> {last:.3f} ({[round(x, 3) for x in rewards]})"


@pytest.mark.slow
def test_remax_dynamic_sampling_and_validation_run_the_multi_turn_loop(tmp_path, tiny_model_dir, arith_data,
                                                                      ray_cluster):
    """ReMax's greedy baseline, DAPO's regeneration rounds and validation all generate through the
    multi-turn loop (their batches carry whole conversations), on two ranks."""
    proj = Path(shutil.copytree(EXAMPLE, tmp_path / "example"))
    (proj / "models").mkdir()
    (proj / "models" / "tiny").symlink_to(tiny_model_dir)
    (proj / "data").mkdir()
    (proj / "data" / "arith").symlink_to(arith_data)
    overrides = ["run.total_steps=2", "run.save_every=0", "algorithm.name=remax", "rollout.n=4",
                 "actor.micro_batch_size=16", "resources.workers=2", "rollout.multi_turn.max_turn_length=0",
                 # two ranks whose conversations have other budgets left: each turn's widths must agree
                 "algorithm.dynamic_sampling.enable=true", "algorithm.dynamic_sampling.max_gen_batches=2",
                 'data.val_files=["data/arith/test.parquet"]', "data.val_batch_size=16"]
    start_training(load_config(proj / "rlctl.toml", overrides), address=None, force=False)
    rows = [json.loads(line) for line in (proj / "runs" / "multiturn-feedback" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[-1]["val/reward/mean"] == rows[-1]["val/reward/mean"] and rows[0]["dynamic_sampling/rounds"] >= 1
    assert rows[0]["multi_turn/turns/mean"] > 1
