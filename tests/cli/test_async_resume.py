"""rollout.mode = "async", killed with kill -9 mid-run through the real CLI, then resumed (in this
process, on the shared Ray's warm ranks: `rlctl resume`'s process is tests/cli/test_interrupt.py's):
the metrics and the final weights equal an uninterrupted run's. K = 2, a push every 2 updates and
the "drop" strategy, so checkpoints hold buffered batches from two versions, groups get dropped
and refilled, and odd steps save the rollout group's older copy of the weights."""

from __future__ import annotations

import os
import pickle
import random
import signal
import time

import pytest
import torch

from rlctl.config.loader import load_config
from rlctl.controller.async_rollout import STATE_FILE as STATE
from rlctl.controller.run import resume_training, start_training
from test_interrupt import ARGS, _session_left, make_project, metrics, rlctl, wait_for_step

ASYNC = ARGS[:] + ["resources.workers=1", "resources.rollout_workers=1", "rollout.mode=async",
                   "rollout.max_staleness=2", "rollout.sync_every=2", "rollout.staleness_strategy=drop",
                   "actor.policy_loss=decoupled_ppo", "run.total_steps=5", "run.save_every=1",
                   "rollout.partial_rollout=true", "rollout.partial_chunk=3", "run.keep_last=5"]
NOISY = ("async/idle_",)   # timing shares


def steady(run) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith(NOISY)} for row in metrics(run)]


def weights(run, out):
    from safetensors.torch import load_file

    from rlctl.checkpoint.merge import export_hf

    return load_file(str(export_hf(run, out) / "model.safetensors"))


@pytest.mark.slow
def test_kill_9_then_resume_matches_the_uninterrupted_async_run(tmp_path, tiny_model_dir, ray_cluster):
    ref = make_project(tmp_path / "ref", tiny_model_dir)
    start_training(load_config(ref / "rlctl.toml", ASYNC), address=None, force=False)
    ref_run = ref / "runs" / "grpo-gsm8k"
    expected = steady(ref_run)
    assert all(r["async/staleness_max"] <= 2 for r in expected)
    assert sum(r["async/dropped"] for r in expected) > 0   # drop + sync_every 2: some groups got too stale
    assert any(r["async/partial_ratio"] > 0 for r in expected)   # some samples straddled a push

    proj = make_project(tmp_path / "killed", tiny_model_dir)
    run = proj / "runs" / "grpo-gsm8k"
    proc = rlctl("train", *ASYNC, cwd=proj)
    wait_for_step(proc, run, 2)
    time.sleep(random.uniform(0.0, 1.0))   # anywhere in step 3, its save included
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert _session_left(proc.pid) == []   # its ranks (process groups of their own) ended too: none still saves
    saved = sorted(run.glob("checkpoints/step_*/async_rollout.pkl"))
    assert saved
    states = [pickle.loads(p.read_bytes()) for p in saved + sorted(ref_run.glob("checkpoints/step_*/" + STATE))]
    assert any(pool and pool["samples"] for s in states for pool in s["partial"]["pool"])   # unfinished samples saved
    odd = run / "checkpoints" / "step_3" / "async_rollout.pkl"
    if odd.is_file():   # between two pushes: the rollout group's older copy is in the checkpoint
        assert pickle.loads(odd.read_bytes())["rollout_weights"] is not None
    resume_training(run, step=None, address=None)
    assert steady(run) == expected
    a, b = weights(ref_run, tmp_path / "a"), weights(run, tmp_path / "b")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
