"""The shipped LoRA recipe (grpo-arith-smollm2-lora-cpu) validates and trains two steps on the tiny
model: an adapter is trained, and on the hf engine (the trainer's own module) no weights travel."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow   # trains a run


def test_the_lora_recipe_trains_an_adapter(tmp_path, make_project, ray_cluster):
    from rlctl.config.loader import load_config
    from rlctl.controller.run import start_training

    proj = make_project(tmp_path, "grpo-arith-smollm2-lora-cpu")
    config = load_config(proj / "rlctl.toml", ["run.total_steps=2", "data.val_files=[]", "rollout.n=4",
                                               "data.batch_size=4", "actor.mini_batch_size=4",
                                               "actor.micro_batch_size=16", "resources.cpus_per_worker=1"])
    assert config.config.model.lora.rank == 16 and config.config.actor.lr == 2e-4
    start_training(config, address=None, force=False)
    run = proj / "runs" / "grpo-arith-smollm2-lora-cpu"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["perf/weight_sync_mb"] == 0.0 for r in rows)   # hf: the trainer's module, nothing pushed
    assert (run / "checkpoints" / "LATEST").read_text().strip() == "step_2"
