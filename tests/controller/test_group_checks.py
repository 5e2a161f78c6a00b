"""Several LoRA runs on one base: the members `--seeds` / `--sweep` make, and what cannot share a base
refused before anything starts (exit 2, one line). No process starts here."""

from __future__ import annotations

import pytest

from rlctl.controller.group import sweep_members
from rlctl.errors import UsageError
from support.cli import rlctl_here

SMALL = ["run.total_steps=1", "data.val_files=[]", "resources.cpus_per_worker=1"]


def test_seeds_and_sweeps_make_the_product_of_their_values_each_named_after_them():
    assert sweep_members("0,1", []) == [("seed0", ["run.seed=0"]), ("seed1", ["run.seed=1"])]
    assert sweep_members(None, ["actor.lr=1e-4,2e-4", "model.lora.rank=8,16"]) == [
        ("lr1e-4-rank8", ["actor.lr=1e-4", "model.lora.rank=8"]),
        ("lr1e-4-rank16", ["actor.lr=1e-4", "model.lora.rank=16"]),
        ("lr2e-4-rank8", ["actor.lr=2e-4", "model.lora.rank=8"]),
        ("lr2e-4-rank16", ["actor.lr=2e-4", "model.lora.rank=16"])]
    assert sweep_members("3", ["actor.lr=1e-3"]) == [("seed3-lr1e-3", ["run.seed=3", "actor.lr=1e-3"])]


@pytest.mark.parametrize("seeds, sweeps, says", [
    (None, ["actor.lr"], "is not KEY=V1,V2"),
    (None, ["actor.lr="], "is not KEY=V1,V2"),
    ("0,1", ["run.seed=2,3"], "run.seed is swept twice"),
    ("0,0", [], "a value is given twice"),
    (None, ["run.name=a,b"], "run folder is named after run.name"),
])
def test_a_sweep_that_names_no_runs_is_a_usage_error(seeds, sweeps, says):
    with pytest.raises(UsageError, match=says):
        sweep_members(seeds, sweeps)


@pytest.mark.parametrize("args, says", [
    (["--seeds", "0,1", "model.lora.rank=0"], "model.lora.rank = 0 (full fine-tuning)"),
    (["--seeds", "0,1", "resources.workers=2", "actor.micro_batch_size=8"], "more than one rank is not built yet"),
    (["--seeds", "0,1", "rollout.mode=one_step_off"], "loads a separate rollout group per run"),
    (["--seeds", "0,1", "model.lora.dropout=0.1"], "model.lora.dropout draws from the worker's one random stream"),
    (["--seeds", "0,1", "run.max_restarts=1"], "restarting a group is not built yet"),
    (["--seeds", "0,1", "algorithm.name=gae", "critic.lr=1e-5",
      "critic.micro_batch_size=8"], "needs the role(s) critic beside the actor"),
    (["--sweep", "resources.cpus_per_worker=1,2"], "resources differs between"),
    (["--sweep", "run.seed=0,x"], "run.seed"),   # a member's own config error, as its solo train says it
])
def test_what_cannot_share_one_base_is_refused_in_one_line(args, says, tmp_path, make_project):
    proj = make_project(tmp_path, "grpo-arith-smollm2-lora-cpu")
    out = rlctl_here("train", proj / "rlctl.toml", *SMALL, *args, cwd=proj)
    assert out.returncode == 2, out.stderr
    assert says in out.stderr
    assert not (proj / "runs").exists()   # nothing was started, no folder claimed


def test_a_different_base_model_is_refused(tmp_path, make_project, tiny_model_dir, tiny_untied_model_dir):
    proj = make_project(tmp_path, "grpo-arith-smollm2-lora-cpu")
    out = rlctl_here("train", proj / "rlctl.toml", *SMALL, "--sweep",
                     f"model.path={tiny_model_dir},{tiny_untied_model_dir}", cwd=proj)
    assert out.returncode == 2 and "model.path differs between" in out.stderr, out.stderr
