"""On-policy distillation through `rlctl train` / `rlctl resume` on CPU: real Ray actors, a teacher
worker group colocated with the actor, the tiny student and a sharper tiny teacher.

The teacher is the student's own tiny model with its final norm scaled by 6 (logits x 6: a peaked
distribution, entropy ~2.5 nats against the student's near-uniform 5.5); OPD with the top-k forward
KL must pull the student toward it within 12 steps. (The k1 policy-gradient form's per-batch
estimate is too noisy to show a trend in 12 steps of 128 tokens on this 260-token vocabulary;
its learning is shown by bench/opd_bench.py and its gradient by tests/algorithms/test_distill.py.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlctl.config.loader import load_config
from rlctl.controller.run import start_training
from support.parquet_rows import write_rows

CPU = ["resources.gpus_per_node=0", "resources.workers=1", "data.max_response_length=8", "data.max_prompt_length=96",
       "data.val_files=[]", "model.dtype=float32", "reward.workers=1", "data.batch_size=4", "rollout.n=4",
       "actor.mini_batch_size=4", "actor.micro_batch_size=16", "actor.use_kl_loss=false", "actor.lr=3e-3",
       "reward.function=arith"]


def make_teacher(out: Path, seed: int, scale: float = 6.0) -> Path:
    """A tiny model (the student's tokenizer) whose logits are `scale` x a random model's."""
    import torch
    from safetensors.torch import load_file, save_file

    from rlctl.models.tiny import build_tiny_model

    build_tiny_model(out, layers=2, hidden=64, heads=4, kv_heads=2, seed=seed)
    weights = load_file(out / "model.safetensors")
    weights["model.norm.weight"] = weights["model.norm.weight"] * scale
    save_file({k: v.contiguous() for k, v in weights.items()}, out / "model.safetensors", metadata={"format": "pt"})
    assert torch.isfinite(weights["model.norm.weight"]).all()
    return out


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def mean(xs) -> float:
    return sum(xs) / len(xs)


@pytest.mark.slow
def test_opd_pulls_the_student_toward_the_teacher(tmp_path, make_project, ray_cluster):
    proj = make_project(tmp_path / "p", "grpo-arith-cpu")
    make_teacher(proj / "teacher", seed=0)
    steps = 12
    start_training(load_config(proj / "rlctl.toml", CPU + [f"run.total_steps={steps}", "distill.teacher=teacher", "distill.loss=forward_kl_topk",
                                                            "run.save_every=0"]), address=None, force=False)
    m = rows(proj / "runs" / "grpo-arith-cpu" / "metrics.jsonl")
    assert [r["step"] for r in m] == list(range(1, steps + 1))
    loss = [r["actor/distill_loss"] for r in m]   # KL(teacher || student) over the teacher's top-8 + rest
    assert mean(loss[-3:]) < mean(loss[:3]) - 0.3, loss
    assert all(r["distill/rkl"] == r["distill/rkl"] and 0 < r["distill/teacher_mass"] < 1 for r in m)
    assert all(r["distill/teacher/token_frac"] == 1.0 for r in m)
    assert all(0.0 <= r["distill/overlap"] <= 1.0 for r in m)


def _two_sources(proj: Path) -> None:
    """data/mixed.parquet: the arith rows, half of them relabelled data_source "other"."""
    import pyarrow.parquet as pq

    table = pq.read_table(proj / "data" / "arith" / "train.parquet").to_pylist()[:32]
    for i, row in enumerate(table):
        row["data_source"] = "rlctl/arith" if i % 2 else "other"
    write_rows(proj / "data" / "mixed.parquet", table)


MULTI = ['data.train_files=["data/mixed.parquet"]', "distill.teachers.other=teacher_b",
         "distill.loss=forward_kl_topk", "run.total_steps=4", "run.save_every=2", "run.keep_last=0"]
NONDETERMINISTIC = ("timing/", "perf/")


def _rlctl(*args, cwd) -> subprocess.CompletedProcess:
    """The CLI of this checkout (not whichever rlctl the interpreter would find from `cwd`)."""
    import os

    import rlctl

    env = {**os.environ, "PYTHONPATH": str(Path(rlctl.__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "rlctl", *args], cwd=cwd, capture_output=True, text=True, env=env)


@pytest.mark.slow
def test_multi_teacher_routing_resume_and_teacher_set_check(tmp_path, make_project, ray_cluster):
    from rlctl.controller.run import resume_training
    from rlctl.errors import CheckpointError

    proj = make_project(tmp_path / "p", "grpo-arith-cpu")
    _two_sources(proj)
    make_teacher(proj / "teacher_a", seed=0)
    make_teacher(proj / "teacher_b", seed=3, scale=1.0)
    # an unknown data_source (rlctl/arith has no teacher) is one line at validate, not a silent fallback
    bad = _rlctl("config", "validate", *CPU, *MULTI, cwd=proj)
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "distill.teacher_key" in bad.stdout + bad.stderr and "'rlctl/arith'" in bad.stdout + bad.stderr

    cfg = CPU + MULTI + ['distill.teachers={"rlctl/arith" = "teacher_a", other = "teacher_b"}']
    start_training(load_config(proj / "rlctl.toml", cfg), address=None, force=False)
    run = proj / "runs" / "grpo-arith-cpu"
    full = [{k: v for k, v in r.items() if not k.startswith(NONDETERMINISTIC)} for r in rows(run / "metrics.jsonl")]
    for r in full:   # each source went to its own teacher (4 prompts a step, drawn from both sources)
        assert r["distill/rlctl/arith/token_frac"] + r["distill/other/token_frac"] == pytest.approx(1.0)
        if "distill/other/rkl" in r and "distill/rlctl/arith/rkl" in r:
            # the sharp teacher (x6) disagrees with the student far more than the unscaled one
            assert r["distill/rlctl/arith/rkl"] > r["distill/other/rkl"] + 0.5
    assert 0.2 < mean([r["distill/other/token_frac"] for r in full]) < 0.8

    resume_training(run, step=2, address=None)   # exact resume with the teachers
    assert [{k: v for k, v in r.items() if not k.startswith(NONDETERMINISTIC)}
            for r in rows(run / "metrics.jsonl")] == full

    make_teacher(proj / "teacher_b", seed=4, scale=1.0)   # same path, other weights: another teacher set
    with pytest.raises(CheckpointError, match="distillation teachers changed"):
        resume_training(run, step=2, address=None)


@pytest.mark.slow
def test_sp2_distillation_run_equals_sp1(tmp_path, make_project, ray_cluster):
    """actor.ulysses_sequence_parallel_size = 2 with a colocated teacher (its pass split over the same
    sp group as the student's) logs the metrics of the same run at sp = 1: float32 rounding, 1e-5."""
    proj = make_project(tmp_path / "p", "grpo-arith-cpu")
    make_teacher(proj / "teacher", seed=0)
    cfg = CPU + ["resources.workers=2", "actor.micro_batch_size=4", "run.total_steps=3", "run.save_every=0",
                 "distill.teacher=teacher", "distill.loss=forward_kl_topk", "run.seed=3"]
    for sp in (2, 1):
        start_training(load_config(proj / "rlctl.toml", cfg + [f"run.name=sp{sp}",
                                                               f"actor.ulysses_sequence_parallel_size={sp}"]),
                       address=None, force=False)
    sp2, sp1 = (rows(proj / "runs" / f"sp{sp}" / "metrics.jsonl") for sp in (2, 1))
    assert [r["step"] for r in sp2] == [r["step"] for r in sp1] == [1, 2, 3]
    for a, b in zip(sp2, sp1):
        for key in ("actor/distill_loss", "distill/rkl", "distill/teacher_mass", "actor/pg_loss", "actor/grad_norm",
                    "reward/mean"):
            assert a[key] == pytest.approx(b[key], abs=1e-5, rel=1e-5), (a["step"], key, a[key], b[key])
