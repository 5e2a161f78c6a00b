"""`rlctl train` with actor.ulysses_sequence_parallel_size = 2 is the run without it, only split:
a short GRPO run (tiny model, arith data, 2 Ray workers forming one sp group) logs the metrics
of the same run at sp = 1, and resuming its step-1 checkpoint at sp = 1 logs the same later steps.
Tolerance 1e-5: float32 rounding (the sp path computes each head and token as one rank does)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl.config.loader import load_config
from rlctl.controller.run import resume_training, start_training

pytestmark = pytest.mark.slow
OVERRIDES = ["resources.workers=2", "resources.cpus_per_worker=1", "data.batch_size=4", "rollout.n=2",
             "actor.mini_batch_size=4", "actor.micro_batch_size=2", "run.total_steps=3", "run.save_every=1",
             "run.keep_last=3", "run.val_every=0", "data.val_files=[]", "reward.workers=1", "run.seed=3"]
KEYS = ("actor/pg_loss", "actor/kl_loss", "actor/kl", "actor/entropy", "actor/grad_norm", "reward/mean")


def _rows(run: Path) -> dict[int, dict]:
    return {row["step"]: row for row in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}


def _same(a: dict, b: dict, step: int) -> None:
    for key in KEYS:
        if key in a:
            assert a[key] == pytest.approx(b[key], abs=1e-5, rel=1e-5), (step, key)


@pytest.mark.timeout(900)
def test_sp2_run_equals_sp1_run_and_resumes_at_sp1(tmp_path, tiny_model_dir, arith_data, ray_cluster):
    from rlctl.project import write_project

    write_project(tmp_path, "grpo-arith-cpu", str(tiny_model_dir))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "arith").symlink_to(arith_data)
    config = tmp_path / "rlctl.toml"
    start_training(load_config(config, [*OVERRIDES, "run.name=sp2", "actor.ulysses_sequence_parallel_size=2"]),
                   address=None, force=False)
    start_training(load_config(config, [*OVERRIDES, "run.name=sp1"]), address=None, force=False)
    sp2, sp1 = _rows(tmp_path / "runs" / "sp2"), _rows(tmp_path / "runs" / "sp1")
    assert sorted(sp2) == sorted(sp1) == [1, 2, 3]
    for step in sp2:
        _same(sp2[step], sp1[step], step)
    resume_training(tmp_path / "runs" / "sp2", step=1, address=None,
                    overrides=["actor.ulysses_sequence_parallel_size=1"])
    resumed = _rows(tmp_path / "runs" / "sp2")
    for step in (2, 3):
        _same(resumed[step], sp2[step], step)
