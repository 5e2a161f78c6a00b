"""SFT end to end on CPU (real Ray actors, 2 gloo ranks, FSDP2): it learns `arith`, a resume from a
mid-run checkpoint (`rlctl resume --step 2` of a copy of the finished run, whose logs past that step are
trimmed) reproduces the uninterrupted run bit for bit, and its output trains under GRPO (the
run folder itself, whose export equals the merged folder), which then merges and evals: the README
demo's chain. One SFT run of 200 steps serves the learning test and the chain. A kill -9 through the
CLI, and the resume after it, are tests/cli/test_interrupt.py's: the run folder and resume are the same
for SFT and RL."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlctl.config.loader import load_config
from rlctl.controller.run import resume_training, start_training

# 2 ranks; the tiny model learns sums fast at this learning rate.
CPU = ["resources.gpus_per_node=0", "resources.workers=2", "model.dtype=float32", "data.batch_size=32",
       "actor.lr=3e-3", "actor.warmup_steps=5", "run.keep_last=0"]
NONDETERMINISTIC = ("timing/", "perf/")


def rows(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(NONDETERMINISTIC)}
            for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def exact_accuracy(model: Path, data: Path, tmp_path: Path) -> float:
    from rlctl.serve.eval import EvalOptions, run_eval

    out = run_eval(model, data, EvalOptions(max_new_tokens=6), tmp_path / f"eval-{model.name}.jsonl")
    return out["all"]["accuracy"]


@pytest.fixture(scope="module")
def learned(tmp_path_factory, sft_project, ray_cluster):
    """One 2-rank SFT run of 200 steps on arith, merged: (project, run folder, merged folder)."""
    from rlctl.checkpoint.merge import merge_run

    proj = sft_project(tmp_path_factory.mktemp("sft"))
    start_training(load_config(proj / "rlctl.toml", CPU + ["run.total_steps=200", "run.val_every=100",
                                                            "run.save_every=100"]), address=None, force=False)
    run = proj / "runs" / "sft-arith-cpu"
    merged = merge_run(run, proj / "models" / "sft").out
    return proj, run, merged


@pytest.mark.slow
def test_sft_lowers_the_loss_and_raises_held_out_accuracy(learned, tiny_model_dir, arith_sft_data, tmp_path):
    proj, run, merged = learned
    metrics = rows(run)
    assert [r["step"] for r in metrics] == list(range(1, 201))
    first, last = sum(r["train/loss"] for r in metrics[:5]) / 5, sum(r["train/loss"] for r in metrics[-5:]) / 5
    assert last < 0.5 * first, (first, last)
    val = [r["val/loss"] for r in metrics if "val/loss" in r]
    assert len(val) == 2 and val[1] < val[0]
    assert all(r["actor/grad_norm"] > 0 and r["actor/lr"] > 0 and r["train/tokens"] > 0 for r in metrics)
    status = render(run)                          # `rlctl status` shows an SFT run's loss, not RL's reward
    assert "loss" in status and "lr" in status and "validation at step 200: loss" in status and "reward" not in status
    held_out = arith_sft_data / "test.parquet"   # pairs never seen in training
    before, after = exact_accuracy(tiny_model_dir, held_out, tmp_path), exact_accuracy(merged, held_out, tmp_path)
    assert after >= before + 0.1, (before, after)
    print(f"held-out exact accuracy: base {before:.3f} -> SFT {after:.3f}")


def render(run: Path) -> str:
    from rich.console import Console

    from rlctl.controller.status import render_status, status_summary

    console = Console(record=True, width=200)
    render_status(status_summary(run), console)
    return console.export_text()


def weights(run: Path, out: Path) -> dict:
    from rlctl.checkpoint.merge import merge_run

    return load_file(str(merge_run(run, out).out / "model.safetensors"))


SHORT = CPU + ["run.total_steps=6", "run.save_every=2", "run.val_every=3", "data.batch_size=8",
               "sft.micro_batch_max_tokens=256"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, sft_project, ray_cluster):
    """The uninterrupted 6-step, 2-rank run: its run folder."""
    proj = sft_project(tmp_path_factory.mktemp("reference"))
    start_training(load_config(proj / "rlctl.toml", SHORT), address=None, force=False)
    return proj / "runs" / "sft-arith-cpu"


@pytest.mark.slow
def test_two_ranks_train_like_one(reference, sft_project, tmp_path):
    proj = sft_project(tmp_path / "one")
    start_training(load_config(proj / "rlctl.toml", SHORT + ["resources.workers=1"]), address=None, force=False)
    one, two = rows(proj / "runs" / "sft-arith-cpu"), rows(reference)
    for key in ("train/loss", "actor/grad_norm", "actor/lr", "train/tokens", "val/loss"):
        a, b = [r[key] for r in one if key in r], [r[key] for r in two if key in r]
        assert len(a) == len(b) > 0 and a == pytest.approx(b, rel=1e-4, abs=1e-6), key


@pytest.mark.slow
def test_a_resume_from_a_mid_run_checkpoint_reproduces_the_run(reference, tmp_path):
    run = tmp_path / "sft-arith-cpu"
    shutil.copytree(reference, run, symlinks=True)
    resume_training(run, step=2, address=None)
    info = json.loads((run / "run.json").read_text())
    assert info["command"] == "resume" and info["resumed_from"] == 2 and info["status"] == "finished"   # it ran
    assert rows(run) == rows(reference)
    a, b = weights(reference, tmp_path / "a"), weights(run, tmp_path / "b")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


GRPO = ["reward.function=arith_exact", "run.total_steps=2", "run.save_every=2", "run.val_every=2",
        "data.batch_size=16", "rollout.n=8", "actor.mini_batch_size=16", "actor.micro_batch_size=32", "actor.lr=1e-4"]


@pytest.mark.slow
def test_sft_run_folder_trains_under_grpo_then_merges_and_evals(learned, sft_project, arith_sft_data, tmp_path):
    """The README demo's chain on a small budget: SFT -> GRPO with the exact-match reward -> merge ->
    eval, every hand-off the real one. model.path = the SFT run folder: its newest checkpoint is merged
    into <run>/hf/step_200, the very weights `rlctl merge` writes (checked), so a merged folder as
    model.path (what the demo does) is the same case. GRPO trains the SFT weights (not the base
    model), its merged export is the policy it validated (the final greedy validation accuracy equals
    `rlctl eval`'s on the same file), and the exact reward scores what eval calls correct."""
    from rlctl.checkpoint.merge import merge_run
    from rlctl.serve.eval import EvalOptions, run_eval

    _, run, merged = learned
    proj = sft_project(tmp_path / "rl", "grpo-arith-cpu", model=run)
    start_training(load_config(proj / "rlctl.toml", GRPO), address=None, force=False)
    rl_run = proj / "runs" / "grpo-arith-cpu"
    metrics = [json.loads(line) for line in (rl_run / "metrics.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in metrics if "reward/mean" in r] == [1, 2]
    # the exact reward: every score is 0 or 1 and equals acc, so the batch means agree
    assert all(r["reward/mean"] == pytest.approx(r["reward/acc"]) for r in metrics if "reward/mean" in r)
    assert metrics[0]["reward/acc"] > 0   # the SFT'd policy already answers some sums: not the base model
    exported = run / "hf" / "step_200"
    assert Path(load_config(rl_run / "config.resolved.toml").config.model.path) == exported.resolve()
    a, b = load_file(str(exported / "model.safetensors")), load_file(str(merged / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    grpo_model = merge_run(rl_run, tmp_path / "models" / "grpo").out
    after = load_file(str(grpo_model / "model.safetensors"))
    assert after.keys() == b.keys() and any(not torch.equal(b[k], after[k]) for k in b)   # GRPO changed them
    out = run_eval(grpo_model, arith_sft_data / "test.parquet", EvalOptions(max_new_tokens=8, engine="hf"),
                   tmp_path / "eval.jsonl")
    lines = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert out["all"]["prompts"] == len(lines) == 40
    assert out["all"]["accuracy"] == pytest.approx(sum(r["correct"] for r in lines) / 40)
    val_acc = next(r["val/acc"] for r in reversed(metrics) if "val/acc" in r)
    assert out["all"]["accuracy"] == pytest.approx(val_acc)   # the export is the policy that was validated
