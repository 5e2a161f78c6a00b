"""Chaos, the rows that matter most: real faults in real Ray actor processes on the tiny model.

- a worker rank killed with SIGKILL mid-run inside `rlctl train` with run.max_restarts: the run tears
  its groups down, starts new ones, loads the newest checkpoint and finishes with the uninterrupted
  run's metrics rows and final weights, bit for bit; run.json and metrics.jsonl count the restart.
  Without a budget (the default) the same kill ends the run with exit 4, as before.
- a save that cannot be written (a file-size limit, RLIMIT_FSIZE, set on the worker processes after
  the first checkpoint: what a full disk does to a write): one line saying how much the step needs,
  exit 3, never retried, and the previous checkpoint still loads.
SIGTERM / SIGINT of the controller: tests/cli/test_interrupt.py; a corrupted shard:
tests/controller/test_resume_corrupted.py. The full matrix (every role, generation / update / save,
signals, a real full tmpfs, the reward service) is bench/chaos.py.
"""

from __future__ import annotations

import json
import resource
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlctl.config.loader import load_config
from rlctl.controller.run import start_training
from rlctl.checkpoint.manager import CheckpointManager
from rlctl.errors import CheckpointError, WorkerDiedError
from controller.test_resume_corrupted import CPU as RESUME_CPU
from support.chaos import kill_worker, latest_step, when, worker_pids

pytestmark = pytest.mark.slow   # starts Ray, trains a run or starts a subprocess

CPU = RESUME_CPU + ["run.total_steps=3"]   # the tiny GRPO run of the resume tests, 3 steps, saves at 2 and 3
VARIES = ("timing/", "perf/", "run/restarts")   # wall clock, and the restart count itself


def rows(run: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(VARIES)}
            for line in (run / "metrics.jsonl").read_text().splitlines()]


def final_weights(run: Path, out: Path) -> dict:
    from rlctl.checkpoint.merge import export_hf

    return load_file(str(Path(export_hf(run, out)) / "model.safetensors"))


@pytest.fixture(autouse=True)
def _only_this_runs_ranks():
    """The faults act on every rank process of this process's Ray (support.chaos.worker_pids): ranks an
    earlier run parked (warm ranks, possibly of another shape) would take a kill or a file-size limit
    meant for the run, and hand it to a later run. None are left before each test."""
    from rlctl.runtime.warm_ranks import drop

    drop()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_model_dir, arith_data, ray_cluster):
    from rlctl.project import write_project

    proj = tmp_path_factory.mktemp("uninterrupted")
    write_project(proj, "grpo-gsm8k", str(tiny_model_dir))
    (proj / "data").mkdir()
    (proj / "data" / "arith").symlink_to(arith_data)
    start_training(load_config(proj / "rlctl.toml", CPU), address=None, force=False)
    run = proj / "runs" / "grpo-gsm8k"
    return rows(run), final_weights(run, proj / "export")


def test_killed_rank_restarts_and_matches_uninterrupted_run(tmp_path, make_project, ray_cluster, uninterrupted,
                                                            capsys):
    proj = make_project(tmp_path / "p", "grpo-gsm8k")
    run = proj / "runs" / "grpo-gsm8k"
    # After step 2's checkpoint, while step 3 runs (or saves): kill -9 one rank of the actor group.
    killer = when(lambda: latest_step(run) == 2, kill_worker)
    start_training(load_config(proj / "rlctl.toml", CPU + ["run.max_restarts=1", "run.restart_backoff_s=0"]),
                   address=None, force=False)
    assert killer.result is not None, "no worker rank was found to kill"
    out = capsys.readouterr().out
    restart_lines = [line for line in out.splitlines() if line.startswith("restart 1/1: actor worker rank")]
    assert len(restart_lines) == 1, out
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "finished" and info["restarts"] == 1 and info["step"] == 3
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["run/restarts"] for r in logged] == [0, 0, 1]

    full_rows, full_weights = uninterrupted
    assert rows(run) == full_rows
    weights = final_weights(run, tmp_path / "export")
    assert weights.keys() == full_weights.keys()
    for name, tensor in full_weights.items():
        assert torch.equal(tensor, weights[name]), name


def test_killed_rank_without_budget_is_exit_4(tmp_path, make_project, ray_cluster):
    proj = make_project(tmp_path / "p", "grpo-gsm8k")
    run = proj / "runs" / "grpo-gsm8k"
    killer = when(lambda: latest_step(run) == 2, kill_worker)
    with pytest.raises(WorkerDiedError, match="actor worker rank"):
        start_training(load_config(proj / "rlctl.toml", CPU), address=None, force=False)
    assert killer.result is not None
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "failed" and info["exit_code"] == 4 and info["restarts"] == 0
    assert latest_step(run) == 2


def test_save_that_cannot_be_written_keeps_the_previous_checkpoint(tmp_path, make_project, ray_cluster):
    proj = make_project(tmp_path / "p", "grpo-gsm8k")
    run = proj / "runs" / "grpo-gsm8k"

    def limit_file_size() -> int:   # half the largest file of step_2: the next save cannot fit
        largest = max(f.stat().st_size for f in (run / "checkpoints" / "step_2").rglob("*") if f.is_file())
        for pid in worker_pids():
            resource.prlimit(pid, resource.RLIMIT_FSIZE, (largest // 2, largest // 2))
        return largest

    limiter = when(lambda: latest_step(run) == 2, limit_file_size)
    with pytest.raises(CheckpointError) as failed:
        start_training(load_config(proj / "rlctl.toml", CPU + ["run.max_restarts=1"]),
                       address=None, force=False)
    assert limiter.result is not None
    message = str(failed.value)
    assert "\n" not in message and message.startswith("checkpoint step_3 could not be saved: actor worker rank")
    assert "File too large" in message and "the step needs about" in message and " is free there" in message
    assert "step_2 is still the newest loadable checkpoint" in message
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "failed" and info["exit_code"] == 3 and info["restarts"] == 0   # never retried
    manager = CheckpointManager.for_run(run)
    assert manager.steps() == [2] and not list(manager.dir.glob(".tmp-*"))
    assert manager.latest_valid(hashes=True) == (2, manager.step_dir(2), None)
