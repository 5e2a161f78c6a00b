"""Stopping a run at any moment never costs more than the steps since its last checkpoint.

Through the real CLI in subprocesses: Ctrl-C (SIGINT) and SIGTERM stop at a safe point with a
checkpoint (exit 130 / 143), also when the terminal's Ctrl-C has ended the `tee` that read the run's
output; kill -9 at a random moment leaves the previous checkpoint; `rlctl resume` then finishes the
run with exactly the uninterrupted run's metrics. One run is stopped four ways in a chain of resumes:
starting a run is most of this module's time, so the stops share one run, and the uninterrupted
reference and the last resume, whose process is not what is tested, run in this process (on the shared
Ray's warm ranks).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlctl.config.loader import load_config
from rlctl.controller.run import resume_training, start_training
from rlctl.project import write_project
from rlctl.tasks.prep import PrepOptions, prepare

ARGS = ["resources.gpus_per_node=0", "resources.workers=2", "data.batch_size=4", "rollout.n=2",
        "actor.mini_batch_size=4", "actor.micro_batch_size=4", "data.max_response_length=8",
        "data.max_prompt_length=96", "data.val_files=[]", 'data.train_files=["data/arith/train.parquet"]',
        "reward.function=arith", "reward.workers=1", "model.dtype=float32", "model.gradient_checkpointing=false",
        "run.total_steps=24", "run.save_every=1", "run.keep_last=2", "actor.lr=1e-3"]
DETERMINISTIC = lambda row: {k: v for k, v in row.items() if not k.startswith(("timing/", "perf/"))}  # noqa: E731


def make_project(root: Path, model: Path) -> Path:
    write_project(root, "grpo-gsm8k", str(model))
    prepare("arith", PrepOptions(out=root / "data" / "arith"))
    return root


def rlctl(*args, cwd, **kw):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "rlctl", *map(str, args)], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True, **kw)


def metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    return [DETERMINISTIC(json.loads(line)) for line in path.read_text().splitlines() if line.strip()]


def wait_for_step(proc, run: Path, step: int, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while len(metrics(run)) < step:
        assert proc.poll() is None, (proc.communicate()[1] or "")[-3000:]
        assert time.monotonic() < deadline, "the run made no progress"
        time.sleep(0.2)


def finish(proc, timeout: float = 600) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


@pytest.fixture(scope="module")
def reference(tmp_path_factory, tiny_model_dir, ray_cluster):
    proj = make_project(tmp_path_factory.mktemp("reference"), tiny_model_dir)
    start_training(load_config(proj / "rlctl.toml", [*ARGS, "run.save_every=0"]), address=None,
                   force=False)   # saves change no metric
    return metrics(proj / "runs" / "grpo-gsm8k")


def stopped_at_a_safe_point(proc, run: Path, exit_code: int, racy: bool = False) -> int:
    """The stopped run's exit code, run.json and LATEST: saved at the safe point it stopped at, or
    (racy: SIGTERM to the whole group) possibly the checkpoint before, when Ray's raylet ended the
    worker ranks first and the run said so. The step it stopped at. A run whose output went into a
    pipe (stderr not captured) can only be judged by its exit code and files."""
    code, err = finish(proc)
    err = err or ""
    assert code == exit_code, err[-3000:]
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "interrupted" and info["exit_code"] == exit_code, info
    latest = (run / "checkpoints" / "LATEST").read_text().strip()
    if "also reached Ray's own processes" in err:           # the raylet ended the workers first
        assert racy and latest in (f"step_{info['step']}", f"step_{info['step'] - 1}"), (latest, info)
    else:
        assert latest == f"step_{info['step']}"             # saved at the safe point it stopped at
        assert len(metrics(run)) == info["step"]
    return info["step"]


def piped_into_a_dead_tee(*args, cwd: Path):
    """`rlctl ... 2>&1 | tee log` whose tee the terminal's Ctrl-C has ended: rlctl's stdout and stderr
    are a pipe nobody reads (EPIPE on the next write). Returns (rlctl, its reader); kill the reader."""
    tee = subprocess.Popen(["cat"], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
    proc = subprocess.Popen([sys.executable, "-m", "rlctl", *map(str, args)], cwd=cwd,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=tee.stdin, stderr=subprocess.STDOUT,
                            start_new_session=True)
    tee.stdin.close()                        # only rlctl holds the pipe's writing end now
    return proc, tee


@pytest.mark.slow
def test_four_ways_to_stop_a_chain_of_resumes_each_keep_a_checkpoint_and_resume_matches(tmp_path, tiny_model_dir,
                                                                                       reference):
    """One run stopped four ways, resumed after each; the last resume reproduces the uninterrupted run.
    1. SIGTERM to the controller (`kill PID`) with no periodic saves: the checkpoint can only come
       from the stop itself, at the safe point it stopped at (exit 143).
    2. The resumed run's output piped into `tee`, still with no periodic saves; a terminal's Ctrl-C ends
       tee first, a step's output goes into the dead pipe, then SIGINT reaches the whole process group
       (Ray's daemons block it): the run still stops at a safe point with the stop's checkpoint (130).
    3. SIGTERM to the whole group (`timeout`, a service manager), saving every step now, also reaches
       Ray's raylet, which kills the worker ranks at once: the run stops with 143 either at a safe point
       (checkpoint) or, when the raylet was faster, saying so and keeping the previous checkpoint.
    4. kill -9 at a random moment, a save included, leaves the previous checkpoint, and the resume
       cleans the killed save's leftovers."""
    proj = make_project(tmp_path, tiny_model_dir)
    run = proj / "runs" / "grpo-gsm8k"
    proc = rlctl("train", *ARGS, "run.save_every=0", cwd=proj)
    wait_for_step(proc, run, 1)
    os.kill(proc.pid, signal.SIGTERM)
    step = stopped_at_a_safe_point(proc, run, 143)

    proc, tee = piped_into_a_dead_tee("resume", run, "run.save_every=0", cwd=proj)
    try:
        wait_for_step(proc, run, step + 1)
        tee.kill()                           # Ctrl-C reached tee first: the reader is gone
        tee.wait()
        wait_for_step(proc, run, step + 2)   # a step's output went into the dead pipe meanwhile
        os.killpg(proc.pid, signal.SIGINT)
        after_ctrl_c = stopped_at_a_safe_point(proc, run, 130)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert after_ctrl_c >= step + 2

    proc = rlctl("resume", run, "run.save_every=1", cwd=proj)
    wait_for_step(proc, run, after_ctrl_c + 1)
    os.killpg(proc.pid, signal.SIGTERM)
    step = stopped_at_a_safe_point(proc, run, 143, racy=True)
    proc = rlctl("resume", run, "run.save_every=1", cwd=proj)
    wait_for_step(proc, run, step + 1)
    time.sleep(random.uniform(0.0, 1.0))  # anywhere in a step, a save included (save_every=1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    # The ranks have process groups of their own: they end when they find Ray gone, and one may still be
    # writing the killed save. The resume (here at once, on warm ranks) starts once they are gone.
    assert _session_left(proc.pid) == []
    assert len(metrics(run)) < len(reference), "the run finished before kill -9: more steps are needed"
    resume_training(run, step=None, address=None)
    assert metrics(run) == reference
    assert not list((run / "checkpoints").glob(".tmp-*"))  # leftovers of the killed save are cleaned


def _wait_for_ray(proc, timeout: float = 180, marker: str = "raylet") -> None:
    """Until a process whose command line has `marker` is among the run's: "raylet" while Ray
    starts (ray.init would have installed its own SIGTERM handler by then), "ray::WorkerHost" while
    the worker ranks start (load the model, join their process group). No step has run yet."""
    import psutil

    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "Ray never started"
        names = " ".join(" ".join(p.cmdline()) for p in psutil.Process(proc.pid).children(recursive=True)
                         if p.is_running())
        if marker in names:
            return
        time.sleep(0.1)


@pytest.mark.slow
@pytest.mark.parametrize("signum,exit_code,group,marker",
                         [(signal.SIGTERM, 143, True, "raylet"), (signal.SIGINT, 130, False, "raylet"),
                          (signal.SIGINT, 130, True, "ray::WorkerHost")],
                         ids=["sigterm-group-ray", "sigint-ray", "ctrl-c-workers"])
def test_signal_while_starting_stops_cleanly(signum, exit_code, group, marker, tmp_path, tiny_model_dir):
    """A stop while Ray or the worker ranks start: one line, exit 130 / 143, run.json "interrupted",
    no process left; either at the start-up's next safe point or, when it is stuck in Ray's native
    code past the grace period, ended by the watchdog (which says so)."""
    proj = make_project(tmp_path, tiny_model_dir)
    run = proj / "runs" / "grpo-gsm8k"
    proc = rlctl("train", *ARGS, cwd=proj)
    _wait_for_ray(proc, marker=marker)
    (os.killpg if group else os.kill)(proc.pid, signum)
    code, err = finish(proc, timeout=120)
    assert code == exit_code, err[-3000:]
    assert "while starting" in err, err[-3000:]
    assert "Traceback" not in err and "SIGTERM received" not in err and "internal error" not in err, err[-3000:]
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "interrupted" and info["exit_code"] == exit_code
    assert metrics(run) == []
    left = _session_left(proc.pid)
    assert left == [], _describe(left)             # Ray's processes went with it


def _describe(pids: list[int]) -> str:
    import psutil

    out = []
    for pid in pids:
        try:
            out.append(f"{pid}: {' '.join(psutil.Process(pid).cmdline())[:150]}")
        except psutil.NoSuchProcess:
            pass
    return "; ".join(out)


def _session_left(sid: int, within: float = 20.0) -> list[int]:
    """Live processes of the session the run was started in (start_new_session=True)."""
    import psutil

    deadline = time.monotonic() + within
    while True:
        left = []
        for p in psutil.process_iter(["pid", "status"]):
            try:
                if os.getsid(p.pid) == sid and p.info["status"] != psutil.STATUS_ZOMBIE:
                    left.append(p.pid)
            except (ProcessLookupError, PermissionError):
                pass
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.3)
