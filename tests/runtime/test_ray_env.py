"""Ray lifecycle: where the address comes from, and nothing left running on any way out."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlctl.runtime.ray_env import resolve_address

HERE = Path(__file__).parent


def test_address_precedence(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert resolve_address(None, "") == ""                     # embedded by default
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert resolve_address(None, "") == "10.0.0.1:6379"        # the shell's RAY_ADDRESS
    assert resolve_address(None, "auto") == "auto"              # resources.address beats it
    assert resolve_address("ray://head:10001", "auto") == "ray://head:10001"  # --address beats all


@pytest.mark.slow
def test_joining_a_missing_cluster_is_a_usage_error_in_seconds():
    code = ("from rlctl.runtime.ray_env import ray_session\n"
            "with ray_session('127.0.0.1:1'):\n    pass\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "UsageError: could not join the Ray cluster at '127.0.0.1:1'" in proc.stderr  # exit 2 in the CLI


def _alive(pids):
    import psutil

    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def _children() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def _session_pids(ray, before: set[int]) -> list[int]:
    """Ray's own processes (GCS, raylet, ...: our new descendants) plus a live actor's worker.
    `before` are the descendants that existed before the session (e.g. multiprocessing's
    resource tracker left by an earlier test in this pytest process): not Ray's to stop."""

    @ray.remote(num_cpus=0)
    class Probe:
        def pid(self):
            return os.getpid()

    worker = ray.get(Probe.remote().pid.remote())
    return sorted((_children() - before) | {worker})


def _wait_gone(pids, within=15.0):
    deadline = time.monotonic() + within
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.3)
    return _alive(pids)


def _commands(pids) -> str:
    import psutil

    out = []
    for pid in pids:
        try:
            out.append(" ".join(psutil.Process(pid).cmdline()))
        except psutil.NoSuchProcess:
            pass
    return "\n".join(out)


@pytest.mark.slow
def test_session_stops_everything_on_success_and_on_error():
    import ray

    from rlctl.runtime.ray_env import ray_session

    before = _children()
    with ray_session(num_cpus=1) as session:
        assert session.embedded and session.owned and session.nodes == 1 and session.cpus == 1
        pids = _session_pids(ray, before)
        commands = _commands(pids)
    assert len(pids) >= 3 and not ray.is_initialized()
    assert _wait_gone(pids) == []
    # the embedded node runs GCS, raylet and its agents, but not the autoscaler monitor, the log
    # monitor (worker output stays in Ray's log files) or the dashboard's API server
    assert "gcs_server" in commands and "raylet" in commands, commands
    for unused in ("autoscaler/_private/monitor.py", "log_monitor.py", "dashboard/dashboard.py"):
        assert unused not in commands, f"{unused} runs:\n{commands}"
    with pytest.raises(RuntimeError, match="controller failed"):
        with ray_session(num_cpus=1, log_to_driver=True):
            pids = _session_pids(ray, before)
            assert "log_monitor.py" in _commands(pids)   # worker output goes to the terminal
            raise RuntimeError("the controller failed")
    assert not ray.is_initialized() and _wait_gone(pids) == []


@pytest.mark.slow
def test_ctrl_c_while_waiting_on_a_worker_leaves_nothing_running(tmp_path):
    report = tmp_path / "pids.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(HERE / "ray_lifecycle_script.py"), "sigint", str(report)],
                          capture_output=True, text=True, env=env, timeout=180)
    inherited = json.loads(report.read_text()).get("inherited") if report.exists() else None
    assert proc.returncode in (-2, 130), (proc.stdout[-500:], proc.stderr[-2000:], inherited)   # -2: re-raised at exit
    assert "KeyboardInterrupt" in proc.stderr
    info = json.loads(report.read_text())
    assert info["embedded"] and len(info["pids"]) >= 3          # gcs, raylet, the worker, ...
    assert _wait_gone(info["pids"]) == []
