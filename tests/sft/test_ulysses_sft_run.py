"""`rlctl train` of an SFT run with actor.ulysses_sequence_parallel_size = 2 is the run without it,
only split: a short run of the sft-arith-sp2-cpu recipe (tiny model, 2 Ray workers forming one sp
group) logs the train and validation losses of the same run at sp = 1, and its step-1 checkpoint
resumed at sp = 1 logs the same later steps.

Tolerance 1e-5 relative: float32 rounding (the sp ranks run attention on all tokens but half the
heads; at sp = 1 the two ranks' micro-batches are cut from their own shards, at sp = 2 from the
pooled rows), which Adam steps at lr 3e-3 carry into the later steps.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl.config.loader import load_config
from rlctl.controller.run import resume_training, start_training

pytestmark = pytest.mark.slow
OVERRIDES = ["resources.gpus_per_node=0", "resources.workers=2", "data.batch_size=8", "run.total_steps=3",
             "run.save_every=1", "run.keep_last=3", "run.val_every=3", "run.seed=3", "actor.warmup_steps=0"]
KEYS = ("train/loss", "actor/grad_norm", "val/loss")
TOL = 1e-5


def _rows(run: Path) -> dict[int, dict]:
    return {row["step"]: row for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


def _same(a: dict, b: dict, step: int) -> None:
    for key in KEYS:
        assert (key in a) == (key in b), (step, key)
        if key in a:
            assert a[key] == pytest.approx(b[key], abs=TOL, rel=TOL), (step, key, a[key], b[key])


@pytest.mark.timeout(900)
def test_sft_sp2_run_equals_sp1_run_and_resumes_at_sp1(tmp_path, sft_project, ray_cluster):
    project = sft_project(tmp_path, "sft-arith-sp2-cpu")
    config = project / "rlctl.toml"
    start_training(load_config(config, [*OVERRIDES, "run.name=sp2"]), address=None, force=False)
    start_training(load_config(config, [*OVERRIDES, "run.name=sp1", "actor.ulysses_sequence_parallel_size=1"]),
                   address=None, force=False)
    sp2, sp1 = _rows(project / "runs" / "sp2"), _rows(project / "runs" / "sp1")
    assert load_config(config).config.actor.ulysses_sequence_parallel_size == 2   # the recipe's own
    assert sorted(sp2) == sorted(sp1) == [1, 2, 3] and "val/loss" in sp2[3]
    assert sp2[3]["train/loss"] < sp2[1]["train/loss"]   # the steps moved the weights
    for step in sp2:
        _same(sp2[step], sp1[step], step)
    resume_training(project / "runs" / "sp2", step=1, address=None,
                    overrides=["actor.ulysses_sequence_parallel_size=1"])
    resumed = _rows(project / "runs" / "sp2")
    for step in (2, 3):
        _same(resumed[step], sp2[step], step)
