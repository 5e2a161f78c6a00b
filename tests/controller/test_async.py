"""rollout.mode = "async" end to end (CPU, real Ray: one actor rank + one or two rollout ranks).

With max_staleness = 1 (partial rollouts off) the schedule issues batch k + 1 right after the push
of update k - 1, which is one_step_off's order: the two runs are equal bit for bit, metrics and
final weights (the kill -9 + resume test through the CLI is tests/cli/test_async_resume.py)."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from rlctl.config.loader import load_config
from rlctl.controller.async_rollout import STATE_FILE as STATE
from rlctl.controller.run import resume_training, start_training
from test_one_step_off import COMMON, OFF
from test_resume import final_weights

SMALL = COMMON + ["data.batch_size=4", "rollout.n=4", "actor.mini_batch_size=4", "actor.micro_batch_size=16", "reward.function=arith",
                  "actor.lr=1e-3", "run.total_steps=3", "run.save_every=0", "resources.rollout_workers=1"]


def rows(run: Path, drop: tuple = ()) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(("timing/", "perf/", "async/idle_") + drop)}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def train(proj: Path, extra: list[str]) -> Path:
    start_training(load_config(proj / "rlctl.toml", SMALL + extra), address=None, force=False)
    return proj / "runs" / "grpo-gsm8k"


@pytest.mark.slow
def test_async_with_staleness_1_equals_one_step_off(tmp_path, make_project, ray_cluster):
    off = train(make_project(tmp_path / "off", "grpo-gsm8k"), OFF)
    run = train(make_project(tmp_path / "async", "grpo-gsm8k"), [
        "rollout.mode=async", "rollout.max_staleness=1", "rollout.sync_every=1", "rollout.staleness_strategy=wait"])
    got = rows(run)
    assert [r["async/staleness_max"] for r in got] == [0.0, 1.0, 1.0]
    assert all(r["async/dropped"] == 0 and r["async/partial_ratio"] == 0 for r in got)
    assert all("rollout/kl" in r for r in got)
    assert rows(run, ("async/",)) == rows(off)
    a, b = final_weights(off, tmp_path), final_weights(run, tmp_path)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_partial_rollouts_on_two_rollout_ranks_train_and_resume_exactly(tmp_path, make_project, ray_cluster,
                                                                       monkeypatch):
    """Partial rollouts on two rollout ranks (the prompts split, a pool each), K = 1, rounds of 3
    tokens for 8-token responses: samples continue across pushes, every trained token is at most 1
    update stale, and resuming from a checkpoint holding unfinished samples on both ranks gives the
    uninterrupted run's metrics and weights bit for bit."""
    monkeypatch.setattr("rlctl.runtime.ray_env.machine_cpus", lambda: 3)   # 1 actor + 2 rollout ranks, one core each
    proj = make_project(tmp_path / "partial", "grpo-gsm8k")
    run = train(proj, ["rollout.mode=async", "rollout.max_staleness=2", "rollout.sync_every=2",
                       "actor.policy_loss=decoupled_ppo", "rollout.partial_rollout=true", "rollout.partial_chunk=3",
                       "resources.rollout_workers=2", "run.total_steps=4", "run.save_every=1", "run.keep_last=0"])
    got = rows(run)
    assert [r["step"] for r in got] == [1, 2, 3, 4]
    assert all(r["async/staleness_max"] <= 2 for r in got) and any(r["async/partial_ratio"] > 0 for r in got), got
    assert all(torch.isfinite(torch.tensor(r["actor/pg_loss"])) for r in got)
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["policy_version"] <= s["step"] - 1 for s in samples if "policy_version" in s)
    both = [step for step in (1, 2, 3) if all(
        pool and pool["samples"] for pool in pickle.loads((run / "checkpoints" / f"step_{step}" / STATE).read_bytes())
        ["partial"]["pool"])]
    assert both, "no checkpoint holds unfinished samples on both rollout ranks"
    weights = final_weights(run, tmp_path)
    resume_training(run, step=both[0], address=None)
    assert rows(run) == got
    again = final_weights(run, tmp_path)
    assert weights.keys() == again.keys() and all(torch.equal(weights[k], again[k]) for k in weights)
