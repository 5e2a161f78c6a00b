"""Fault injection for the chaos suite (tests/chaos) and bench/chaos.py: real processes, real signals.

A worker rank is a Ray actor process whose title Ray sets to `ray::WorkerHost...` (the class behind
every rank, rlctl.runtime.host); it is found among the descendants of the process that started Ray
(the test process, or an `rlctl train` subprocess) and killed with SIGKILL, as a preempted node or
the kernel's OOM killer would.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Callable


def worker_pids(root: int | None = None) -> list[int]:
    """Live worker-rank processes under `root` (default: this process), oldest first."""
    import psutil

    found = []
    for proc in psutil.Process(root or os.getpid()).children(recursive=True):
        try:
            if proc.cmdline()[:1] and proc.cmdline()[0].startswith("ray::WorkerHost") and proc.is_running():
                found.append((proc.create_time(), proc.pid))
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return [pid for _, pid in sorted(found)]


def latest_step(run: Path) -> int:
    """The step checkpoints/LATEST names (0: none yet)."""
    try:
        return int((run / "checkpoints" / "LATEST").read_text().strip().removeprefix("step_"))
    except (OSError, ValueError):
        return 0


def metric_rows(run: Path) -> int:
    path = run / "metrics.jsonl"
    return len(path.read_text().splitlines()) if path.is_file() else 0


def when(condition: Callable[[], bool], action: Callable[[], object], *, delay_s: float = 0.0,
         timeout_s: float = 300.0) -> threading.Thread:
    """A daemon thread that runs `action` once `condition` holds (polled every 50 ms), after `delay_s`;
    `thread.result` is what the action returned (None if the condition never held)."""
    def watch():
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if condition():
                time.sleep(delay_s)
                thread.result = action()
                return
            time.sleep(0.05)

    thread = threading.Thread(target=watch, daemon=True)
    thread.result = None
    thread.start()
    return thread


def kill_worker(root: int | None = None, index: int = -1) -> int | None:
    """SIGKILL one worker rank (the newest by default); its pid, or None when none was running."""
    pids = worker_pids(root)
    if not pids:
        return None
    victim = pids[index]
    os.kill(victim, signal.SIGKILL)
    return victim
