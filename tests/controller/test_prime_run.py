"""PRIME through the loop on two ranks: the implicit PRM (colocated, like the critic) starts equal to its
reference (step 1's BCE is ln 2), its state is checkpointed under prm/ and restored exactly on resume,
and `rlctl merge` exports the policy alone, as for any other run."""

from __future__ import annotations

import json
import math

import pytest
from safetensors.torch import load_file

from rlctl.config.loader import load_config

SMALL = ["resources.workers=2", "data.batch_size=4", "rollout.n=2", "actor.mini_batch_size=4",
         "actor.micro_batch_size=4", "data.val_files=[]", "run.total_steps=3", "run.save_every=1",
         "run.keep_last=0", "algorithm.params.prm_lr=0.01"]


@pytest.mark.slow
def test_prime_runs_resumes_exactly_and_merges_the_policy(tmp_path, make_project, ray_cluster, tiny_model_dir):
    from rlctl.controller.run import start_training
    from test_resume import check_resume_reproduces

    proj = make_project(tmp_path / "p", "prime-arith-cpu")
    start_training(load_config(proj / "rlctl.toml", SMALL), address=None, force=False)
    run = proj / "runs" / "prime-arith-cpu"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[0]["prm/loss"] == pytest.approx(math.log(2.0), abs=1e-5)   # PRM = reference before its first step
    assert rows[0]["prm/process_reward_mean"] != 0                          # scored after that step ("before")
    assert all(r["prm/optimizer_steps"] == 1 for r in rows)
    assert (run / "checkpoints" / "step_2" / "prm").is_dir()
    check_resume_reproduces(run, 2, tmp_path)   # metrics rows (prm/* too) and the merged policy, bit for bit
    from rlctl.checkpoint.merge import export_hf

    merged = load_file(str(export_hf(run, tmp_path / "merged") / "model.safetensors"))
    assert merged.keys() == load_file(str(tiny_model_dir / "model.safetensors")).keys()


@pytest.mark.slow
def test_the_prm_in_a_pool_of_its_own(tmp_path, make_project, ray_cluster):
    """resources.colocate = false: the PRM gets its own ranks, as a critic would, and still learns."""
    from rlctl.controller.run import start_training

    proj = make_project(tmp_path / "apart", "prime-arith-cpu")
    overrides = [o for o in SMALL if not o.startswith(("resources.workers", "run.total_steps"))]
    start_training(load_config(proj / "rlctl.toml", overrides + ["resources.workers=1", "resources.colocate=false",
                                                                 "run.total_steps=2"]), address=None, force=False)
    rows = [json.loads(line) for line in (proj / "runs" / "prime-arith-cpu" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["prm/loss"] == pytest.approx(math.log(2.0), abs=1e-5) and rows[1]["prm/loss"] != rows[0]["prm/loss"]
