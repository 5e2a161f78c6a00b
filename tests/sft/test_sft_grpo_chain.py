"""The README demo's chain on a small budget: SFT -> merge -> GRPO from the merged folder with the
exact-match reward -> merge -> eval. Real Ray actors, 2 gloo ranks, the real reward pool.

The demo (scripts/demo.sh) shows the full effect; here the checks are that every hand-off is the
real one: GRPO trains the SFT weights (not the base model), its merged export is the policy it
validated (the final greedy validation accuracy equals `rlctl eval`'s on the same file), and the
exact reward scores what eval calls correct."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlctl.config.loader import load_config
from rlctl.controller.run import start_training

SFT = ["resources.gpus_per_node=0", "resources.workers=2", "model.dtype=float32", "data.batch_size=32",
       "actor.lr=3e-3", "actor.warmup_steps=5", "run.total_steps=120", "run.save_every=120", "run.val_every=0"]
GRPO = ["reward.function=arith_exact", "run.total_steps=2", "run.save_every=2", "run.val_every=2",
        "data.batch_size=16", "rollout.n=8", "actor.mini_batch_size=16", "actor.micro_batch_size=32", "actor.lr=1e-4"]


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_sft_output_trains_under_grpo_then_merges_and_evals(sft_project, arith_sft_data, tmp_path, ray_cluster):
    from rlctl.checkpoint.merge import merge_run
    from rlctl.serve.eval import EvalOptions, run_eval

    sft = sft_project(tmp_path / "sft")
    start_training(load_config(sft / "rlctl.toml", SFT), address=None, force=False)
    sft_model = merge_run(sft / "runs" / "sft-arith-cpu", tmp_path / "models" / "sft").out

    rl = sft_project(tmp_path / "grpo", "grpo-arith-cpu", model=sft_model)
    start_training(load_config(rl / "rlctl.toml", GRPO), address=None, force=False)
    rl_run = rl / "runs" / "grpo-arith-cpu"
    rows = metrics(rl_run)
    assert [r["step"] for r in rows if "reward/mean" in r] == [1, 2]
    # the exact reward: every score is 0 or 1 and equals acc, so the batch means agree
    assert all(r["reward/mean"] == pytest.approx(r["reward/acc"]) for r in rows if "reward/mean" in r)
    assert rows[0]["reward/acc"] > 0   # the SFT'd policy answers some sums (the base model none): it is what trains
    assert Path(load_config(rl_run / "config.resolved.toml").config.model.path) == sft_model.resolve()

    grpo_model = merge_run(rl_run, tmp_path / "models" / "grpo").out
    before = load_file(str(sft_model / "model.safetensors"))
    after = load_file(str(grpo_model / "model.safetensors"))
    assert before.keys() == after.keys() and any(not torch.equal(before[k], after[k]) for k in before)

    held_out = arith_sft_data / "test.parquet"
    out = run_eval(grpo_model, held_out, EvalOptions(max_new_tokens=8, engine="hf"), tmp_path / "eval.jsonl")
    lines = [json.loads(line) for line in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert out["all"]["prompts"] == len(lines) == 40
    assert out["all"]["accuracy"] == pytest.approx(sum(r["correct"] for r in lines) / 40)
    val_acc = next(r["val/acc"] for r in reversed(rows) if "val/acc" in r)
    assert out["all"]["accuracy"] == pytest.approx(val_acc)   # the export is the policy that was validated
