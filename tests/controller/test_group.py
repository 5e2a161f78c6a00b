"""Several LoRA runs on one base (`rlctl train --seeds`): each member's metrics and adapter are its solo
run's, bit for bit, and a group resumes together. One module, one shared Ray: the group of two, then
each member's solo run in the same session."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

pytestmark = pytest.mark.slow   # trains runs

RUN = ["run.total_steps=3", "run.save_every=1", "run.keep_last=0", "data.val_files=[]", "rollout.n=4",
       "data.batch_size=4", "actor.mini_batch_size=4", "actor.micro_batch_size=16", "resources.cpus_per_worker=1",
       "data.max_response_length=8", "actor.lr=1e-2", "reward.overlong.enable=true",
       "reward.overlong.buffer_len=4"]   # rewards that differ: real updates
NONDETERMINISTIC = ("timing/", "perf/")


def rows(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(NONDETERMINISTIC)}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def adapter(run: Path, step: int) -> dict:
    """The actor's saved tensors (the LoRA A and B of every layer) at checkpoint `step`."""
    out = {}
    for shard in sorted((run / "checkpoints" / f"step_{step}" / "actor" / "model").glob("*.safetensors")):
        out.update(load_file(str(shard)))
    assert any("lora_" in name for name in out)
    return out


def assert_same_run(group_run: Path, solo_run: Path, step: int) -> None:
    assert rows(group_run) == rows(solo_run)
    got, want = adapter(group_run, step), adapter(solo_run, step)
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


def test_each_member_is_its_solo_run_and_the_group_resumes(tmp_path, make_project, ray_cluster):
    from rlctl.config.loader import load_config
    from rlctl.controller.group import load_members, resume_group, start_group, sweep_members
    from rlctl.controller.run import start_training

    proj = make_project(tmp_path / "group", "grpo-arith-smollm2-lora-cpu")
    members = load_members(proj / "rlctl.toml", RUN, sweep_members("0,1", []))
    start_group(members, address=None, force=False)
    runs = proj / "runs"
    names = ["grpo-arith-smollm2-lora-cpu-seed0", "grpo-arith-smollm2-lora-cpu-seed1"]
    assert sorted(p.name for p in runs.iterdir()) == names
    for name in names:
        info = json.loads((runs / name / "run.json").read_text())
        assert info["status"] == "finished" and info["step"] == 3
    assert all(any(r["actor/grad_norm"] > 0 for r in rows(runs / name)) for name in names)   # adapters that moved
    first = adapter(runs / names[0], 3)
    assert any(not torch.equal(t, adapter(runs / names[1], 3)[k]) for k, t in first.items())   # two seeds, two runs

    resume_group([runs / n for n in names], address=None, overrides=["run.total_steps=4"])   # one more step, together
    for name in names:
        assert [r["step"] for r in rows(runs / name)] == [1, 2, 3, 4]

    solo = make_project(tmp_path / "solo", "grpo-arith-smollm2-lora-cpu")
    for seed, name in enumerate(names):
        start_training(load_config(solo / "rlctl.toml", [*RUN, "run.total_steps=4", f"run.seed={seed}",
                                                         f"run.name={name}"]), address=None, force=False)
        assert_same_run(runs / name, solo / "runs" / name, 4)
