"""`rlctl train` of an SFT run on a tiny Qwen3-MoE (4 experts, top-2) with the experts split over the
2 Ray workers (actor.expert_parallel_size = 2): the loss falls, the load-balancing loss is logged,
and `rlctl resume` from an earlier checkpoint reproduces the uninterrupted run's metrics and
weights bit for bit (the merged folder holds every expert; merge verifies its logits)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlctl.config.loader import load_config
from rlctl.controller.run import resume_training, start_training

pytestmark = pytest.mark.slow
OVERRIDES = ["resources.gpus_per_node=0", "resources.workers=2", "actor.expert_parallel_size=2",
             "data.batch_size=16", "run.total_steps=5", "run.save_every=1", "run.keep_last=0", "run.val_every=5",
             "run.seed=3", "actor.warmup_steps=0"]
NONDETERMINISTIC = ("timing/", "perf/")


def _rows(run: Path) -> dict[int, dict]:
    """Step -> metrics without the timings (a resumed step's row replaces the first one)."""
    out = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        out[row["step"]] = {k: v for k, v in row.items() if not k.startswith(NONDETERMINISTIC)}
    return out


def _merged(run: Path, out: Path) -> dict[str, torch.Tensor]:
    from rlctl.checkpoint.merge import merge_run

    merge_run(run, out)
    weights = {}
    for f in sorted(out.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    return weights


@pytest.mark.timeout(900)
def test_sft_at_ep2_lowers_the_loss_and_resumes_exactly(tmp_path, sft_project, ray_cluster):
    from rlctl.models.tiny import build_tiny_model

    build_tiny_model(tmp_path / "moe", arch="qwen3_moe")
    project = sft_project(tmp_path / "proj", "sft-arith-cpu", model=tmp_path / "moe")
    start_training(load_config(project / "rlctl.toml", OVERRIDES), address=None, force=False)
    run = project / "runs" / "sft-arith-cpu"
    first = _rows(run)
    assert sorted(first) == [1, 2, 3, 4, 5] and "val/loss" in first[5]
    assert first[5]["train/loss"] < first[1]["train/loss"]
    assert all(row["actor/moe_aux_loss"] >= 2 - 1e-3 for row in first.values())   # top-2: 2 when balanced
    before = _merged(run, tmp_path / "a")
    experts = {k.split(".experts.")[1].split(".")[0] for k in before if ".mlp.experts." in k}
    assert experts == {"0", "1", "2", "3"}   # transformers writes them one by one: all 4 in every layer

    resume_training(run, step=2, address=None)
    assert _rows(run) == first
    after = _merged(run, tmp_path / "b")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
