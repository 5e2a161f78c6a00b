"""The fast tier's rule, held while each test runs: a test not marked `slow` starts no process.

Starting Ray (its GCS and raylet), training a run (its Ray workers), a `sys.executable`
subprocess, a process pool or a fork all go through one of the three calls `watch` replaces, so a
test that does any of them without `@pytest.mark.slow` fails naming the call, instead of quietly
making `pytest -m "not slow"` slower. The call raises `StartsAProcess` (a BaseException, so an
`except Exception` in the code under test cannot swallow it) before any process exists, and the
violation is also kept for the test's teardown, in case something catches even that. Threads an
earlier test left running (a pool replacing a worker) are not watched; the test's own are.

A test that uses an already running Ray without starting it (the module-scoped `ray_cluster`
fixture) is found before its setup instead: `RAY_FIXTURES`.
"""

from __future__ import annotations

import contextlib
import multiprocessing.process
import os
import subprocess
import threading
import traceback

import pytest

# Fixtures that hand a test a running Ray (started by the fixture, possibly for an earlier test).
RAY_FIXTURES = ("ray_cluster",)
VIOLATIONS = pytest.StashKey[list]()   # a test's refused process starts
HINT = "mark it @pytest.mark.slow (module-level `pytestmark = pytest.mark.slow` for a whole file)"


class StartsAProcess(BaseException):
    """A test outside the slow tier started (or was about to start) a process."""


def _caller() -> str:
    """The innermost frame outside this module, subprocess and multiprocessing: who asked."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if not any(part in frame.filename for part in ("/subprocess.py", "/multiprocessing/", __file__)):
            return f"{frame.filename}:{frame.lineno}"
    return "?"


@contextlib.contextmanager
def watch(violations: list[str]):
    """Refuse every process start inside the block; each refusal is appended to `violations`."""
    real = {"popen": subprocess.Popen._execute_child, "process": multiprocessing.process.BaseProcess.start,
            "fork": os.fork}

    # a thread an earlier (slow) test left running, e.g. a pool replacing a worker, is not this test's
    older = {t.ident for t in threading.enumerate() if t is not threading.main_thread()}

    def refuse(what: str):
        original = real[{"subprocess": "popen", "multiprocessing": "process", "os.fork": "fork"}[what]]

        def call(*args, **kwargs):
            if threading.get_ident() in older:
                return original(*args, **kwargs)
            violations.append(f"{what} from {_caller()}")
            raise StartsAProcess(f"a test not marked slow started a process ({what} from {_caller()}): {HINT}")
        return call

    subprocess.Popen._execute_child = refuse("subprocess")   # every subprocess.* call, Ray's start-up too
    multiprocessing.process.BaseProcess.start = refuse("multiprocessing")   # Process, Pool, ProcessPoolExecutor
    os.fork = refuse("os.fork")
    try:
        yield
    finally:
        subprocess.Popen._execute_child = real["popen"]
        multiprocessing.process.BaseProcess.start = real["process"]
        os.fork = real["fork"]


def collection_problems(items) -> list[str]:
    """Fast-tier tests that take a running Ray from a fixture (RAY_FIXTURES)."""
    return [f"{item.nodeid} uses {name} (a running Ray) but is not marked slow: {HINT}"
            for item in items if item.get_closest_marker("slow") is None
            for name in RAY_FIXTURES if name in getattr(item, "fixturenames", ())]
