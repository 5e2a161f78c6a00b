"""Exact resume: a run resumed from checkpoint k reproduces the uninterrupted run's metrics rows and
final weights bit for bit (CPU). Plus the ways resume must refuse or fall back.

GRPO's is checked here (2 ranks, then the refusals and fallbacks on that run); every other recipe's
is folded into its learning run (tests/controller/test_learning.py: resumed from step 22 of 24, with
DAPO's dynamic sampling and PPO's adaptive KL-in-reward across 2 ranks), one run fewer per recipe.

`rlctl resume --step 2` on a finished 4-step run is the same as resuming a run killed right after
its step-2 checkpoint: logs past the checkpoint are dropped and everything after it is recomputed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlctl.config.loader import load_config
from rlctl.controller.checkpointing import prepare_resume
from rlctl.controller.run import resume_training, start_training
from rlctl.errors import CheckpointError, UsageError
from test_resume_corrupted import check_corrupted_newest_checkpoint_falls_back

CPU = ["resources.gpus_per_node=0", "resources.workers=2", "data.batch_size=4", "actor.mini_batch_size=2",
       "actor.micro_batch_size=2", "critic.mini_batch_size=2", "critic.micro_batch_size=2", "actor.ppo_epochs=2",
       "data.max_response_length=8", "data.max_prompt_length=96", "data.val_files=[]",
       'data.train_files=["data/arith/train.parquet"]', "reward.function=arith", "reward.workers=1",
       "reward.overlong.buffer_len=4", "model.dtype=float32", "model.gradient_checkpointing=false",
       "run.total_steps=4", "run.save_every=2", "run.keep_last=0", "actor.lr=1e-3"]
GROUPED = ["rollout.n=2"]
NONDETERMINISTIC = ("timing/", "perf/")


def rows(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(NONDETERMINISTIC)}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def final_weights(run: Path, tmp_path: Path) -> dict:
    from rlctl.checkpoint.merge import export_hf

    out = export_hf(run, tmp_path / f"export-{run.name}-{len(list(tmp_path.iterdir()))}")
    return load_file(str(Path(out) / "model.safetensors"))


def check_resume_reproduces(run: Path, step: int, tmp_path: Path) -> None:
    """Resume the finished `run` from its step-`step` checkpoint: the same metrics rows and final
    weights as the uninterrupted run, bit for bit."""
    full_rows, full_weights = rows(run), final_weights(run, tmp_path)
    resume_training(run, step=step, address=None)
    resumed_rows, resumed_weights = rows(run), final_weights(run, tmp_path)
    assert resumed_rows == full_rows
    assert resumed_weights.keys() == full_weights.keys()
    for name, tensor in full_weights.items():
        assert torch.equal(tensor, resumed_weights[name]), name


def resumes_exactly(proj: Path, recipe: str, tmp_path: Path) -> Path:
    """Train `recipe` (grouped) 4 steps, then resume it from its step-2 checkpoint: the same metrics rows and
    final weights, bit for bit. The run folder (a finished 4-step run again)."""
    start_training(load_config(proj / "rlctl.toml", CPU + GROUPED), address=None, force=False)
    run = proj / "runs" / recipe
    assert [r["step"] for r in rows(run)] == [1, 2, 3, 4]
    check_resume_reproduces(run, 2, tmp_path)
    return run


@pytest.mark.slow
def test_grpo_resume_reproduces_the_run_then_refuses_changed_config_and_falls_back(tmp_path, make_project,
                                                                                   ray_cluster, capsys,
                                                                                   monkeypatch):
    """GRPO's exact resume, then, on that finished run (one run fewer to start), the ways resume
    must refuse or fall back: a corrupted newest checkpoint through `rlctl resume` (the CLI entry,
    tests/controller/test_resume_corrupted.py), then the config changes."""
    proj = make_project(tmp_path / "p", "grpo-gsm8k")
    run = resumes_exactly(proj, "grpo-gsm8k", tmp_path)
    monkeypatch.chdir(proj)
    check_corrupted_newest_checkpoint_falls_back(run, capsys)
    with pytest.raises(UsageError, match="already has checkpoints"):
        start_training(load_config(proj / "rlctl.toml", CPU + GROUPED), address=None, force=True)

    # A breaking change in the run's config (the model's algorithm) is refused, naming the key.
    resolved = run / "config.resolved.toml"
    original = resolved.read_text()
    resolved.write_text(original.replace('name = "grpo"', 'name = "rloo"'))
    with pytest.raises(CheckpointError, match="algorithm.name"):
        resume_training(run, step=None, address=None)
    resolved.write_text(original)

    # A harmless change is allowed; a different worker count reshards (DCP) and carries on.
    resume_training(run, step=2, address=None, overrides=["resources.workers=1", "run.total_steps=5",
                                                           "actor.micro_batch_size=4"])
    assert [r["step"] for r in rows(run)] == [1, 2, 3, 4, 5]
    assert 'workers = 1' in resolved.read_text()
    resume_training(run, step=4, address=None, overrides=["resources.workers=2", "run.total_steps=4",
                                                           "actor.micro_batch_size=2"])
    with pytest.raises(CheckpointError, match="model.path"):
        resume_training(run, step=None, address=None, overrides=["model.path=/elsewhere"])

    # LATEST names a broken checkpoint: resume falls back to the newest valid one, with a warning.
    assert (run / "checkpoints" / "LATEST").read_text().strip() == "step_5"
    shutil.rmtree(run / "checkpoints" / "step_5" / "actor")
    _, notices, step, _ = prepare_resume(run, None)
    assert step == 4 and any("WARNING" in n and "step_5" in n for n in notices)
