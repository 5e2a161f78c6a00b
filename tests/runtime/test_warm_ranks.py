"""Warm ranks (RLCTL_WARM_RANKS=1, rlctl.runtime.warm_ranks): the runs of one Ray session reuse the rank
processes of the last group of their shape. A run on reused ranks must equal the same run on new ones; a
group of another shape parks beside them while the Ray session has room and frees the longest-parked ones
when it has not, and one started with the switch off frees them all;
a rank that ran a project's own code must end with its run; a rank that died while parked must not be
handed out. The suite runs with the switch on (tests/conftest.py), so every resume test also checks a
resumed run on warm ranks against its uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import types
import uuid
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from controller.conftest import arith_data, make_project  # noqa: F401  (pytest fixtures)
from rlctl.config.loader import load_config
from rlctl.controller.run import start_training
from rlctl.runtime.host import unforgettable_modules
from rlctl.runtime.warm_ranks import ENV, drop
from support.chaos import worker_pids

RUN = ["resources.gpus_per_node=0", "resources.workers=2", "data.batch_size=4", "rollout.n=2",
       "actor.mini_batch_size=2", "actor.micro_batch_size=2", "data.max_response_length=8",
       "data.max_prompt_length=96", "data.val_files=[]", 'data.train_files=["data/arith/train.parquet"]',
       "reward.function=arith", "reward.workers=1", "model.dtype=float32", "model.gradient_checkpointing=false",
       "run.total_steps=2", "run.save_every=2", "actor.lr=1e-3"]
TIMING = ("timing/", "perf/")

PLUGIN = '''
from rlctl.algorithms import aggregate_loss, register_policy_loss

@register_policy_loss("reinforce_{tag}")
def reinforce(*, log_prob, advantages, response_mask, loss_agg_mode, norm, **_):
    return aggregate_loss(-advantages * log_prob, response_mask, loss_agg_mode, norm=norm), {{}}
'''


def test_code_from_outside_the_installed_packages_and_engines_are_unforgettable(monkeypatch):
    found = unforgettable_modules()
    assert __name__ in found                                  # this test file: not an installed package
    assert not {"torch", "rlctl", "rlctl.runtime.host", "numpy"} & set(found)
    monkeypatch.setitem(sys.modules, "vllm", types.ModuleType("vllm"))
    assert "vllm" in unforgettable_modules()                  # an engine's process-wide state, wherever it lives


def rank_processes() -> list[int]:
    """Pids of the live rank processes of this process's embedded Ray (not another pytest worker's)."""
    return sorted(worker_pids())


def ranks_after_kills(gone: list[int] | tuple = (), within_s: float = 20.0) -> list[int]:
    """The live rank processes once no rank in `gone` (every rank when empty) is left, or after within_s:
    a killed group's processes end shortly after `ray.kill` returns, not at once."""
    deadline = time.monotonic() + within_s
    while True:
        live = rank_processes()
        if not (set(live) & set(gone) if gone else live) or time.monotonic() > deadline:
            return live
        time.sleep(0.1)


def train(proj: Path, name: str, *overrides: str) -> Path:
    start_training(load_config(proj / "rlctl.toml", RUN + [f"run.name={name}", *overrides]), address=None,
                   force=False)
    return proj / "runs" / name


def rows(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(TIMING)}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def weights(run: Path, out: Path) -> dict:
    from rlctl.checkpoint.merge import export_hf

    return load_file(str(Path(export_hf(run, out)) / "model.safetensors"))


@pytest.mark.slow
def test_a_run_on_warm_ranks_equals_one_on_new_ranks_and_shapes_park_side_by_side_until_room_runs_out(
        tmp_path, make_project, ray_cluster, monkeypatch):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    proj = make_project(tmp_path / "p", "grpo-gsm8k")
    drop()                                          # ranks an earlier module parked in the shared Ray
    assert ranks_after_kills() == []
    monkeypatch.setenv(ENV, "1")
    first = train(proj, "first")
    parked = rank_processes()
    assert len(parked) == 2                         # on: the run's two ranks wait for the next run
    second = train(proj, "second")
    assert rank_processes() == parked               # ... which ran on them

    # One rank with two CPUs: another shape, with room beside the parked pair in this 6-CPU Ray, which
    # stays parked; the single rank parks beside it.
    train(proj, "one", "resources.workers=1", "resources.cpus_per_worker=2")
    single = sorted(set(rank_processes()) - set(parked))
    assert len(single) == 1 and set(parked) <= set(rank_processes())

    # No room left (another placement group holds the last 2 CPUs): a third shape frees the longest-parked
    # group, the pair, and no more; the single rank stays parked.
    blocker = placement_group([{"CPU": 2.0}])
    ray.get(blocker.ready(), timeout=60)
    try:
        deadline = time.monotonic() + 20
        while ray.available_resources().get("CPU", 0.0) > 0 and time.monotonic() < deadline:
            time.sleep(0.2)                         # the session's view of its free CPUs catches up
        train(proj, "lone", "resources.workers=1")
        live = ranks_after_kills(gone=parked)
        assert not set(live) & set(parked) and set(single) <= set(live) and len(live) == 2, (live, parked, single)
    finally:
        remove_placement_group(blocker)

    # With the switch off, the parked ranks let go of their CPUs, and a finished run leaves no rank behind.
    monkeypatch.delenv(ENV)
    fresh = train(proj, "fresh")
    assert ranks_after_kills() == []
    assert rows(fresh) == rows(first) == rows(second) and len(rows(fresh)) == 2
    new, warm = weights(fresh, tmp_path / "w-fresh"), weights(second, tmp_path / "w-second")
    assert new.keys() == warm.keys()
    for name, tensor in new.items():
        assert torch.equal(tensor, warm[name]), name


def test_a_parked_rank_gets_its_start_up_resource_limits_back():
    """A run that lowered a rank's file-size limit (tests/chaos/test_faults.py does, to fail a save) must
    not hand that limit to the next run on the parked rank: its saves would fail with EFBIG."""
    import resource

    from rlctl.runtime.host import _resource_limits, _restore_resource_limits

    start = _resource_limits()
    soft, hard = start[resource.RLIMIT_FSIZE]
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, hard))
        assert _restore_resource_limits(start)
        assert resource.getrlimit(resource.RLIMIT_FSIZE) == (soft, hard)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


@pytest.mark.slow
def test_a_rank_that_imported_a_project_file_or_died_while_parked_is_not_reused(tmp_path, make_project, ray_cluster, monkeypatch):
    """A plugin registers its loss in the rank's registry; a reused rank would still hold it (and refuse
    the same name from the next project's file), so such ranks are never parked."""
    drop()                                          # ranks an earlier test or module parked in the shared Ray
    monkeypatch.setenv(ENV, "1")
    tag = uuid.uuid4().hex[:8]   # registries are per process: the controller (this process) keeps the name
    proj = make_project(tmp_path / "p", "grpo-gsm8k")
    (proj / "algos.py").write_text(PLUGIN.format(tag=tag))
    train(proj, "plugin", 'algorithm.plugins=["algos.py"]', f"actor.policy_loss=reinforce_{tag}")
    assert ranks_after_kills() == []
    train(proj, "plain")
    parked = rank_processes()
    assert len(parked) == 2

    # A parked rank that died meanwhile (the OOM killer, a signal) is not handed out: the next run starts anew.
    os.kill(parked[0], signal.SIGKILL)
    train(proj, "after-a-kill")
    live = ranks_after_kills(gone=parked)
    assert len(live) == 2 and not set(live) & set(parked)
