"""The fast tier's rule is held by tests/conftest.py (tests/support/tiers.py): these tests are not
marked slow, so every process start in them must be refused before any process exists."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest
from support import tiers

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def refusals(request):
    """The violations the running test's guard kept; emptied at the end, since these ones are planted."""
    found = request.node.stash[tiers.VIOLATIONS]
    yield found
    found.clear()


@pytest.mark.parametrize("start", [
    lambda: subprocess.run([sys.executable, "-c", "pass"], check=True),
    lambda: subprocess.Popen(["true"]),
    lambda: multiprocessing.get_context("spawn").Process(target=print).start(),
    lambda: multiprocessing.get_context("fork").Process(target=print).start(),
    lambda: os.fork(),   # looked up at call time: the guard replaces the module attribute
], ids=["subprocess.run", "Popen", "spawn", "fork-context", "os.fork"])
def test_a_fast_test_cannot_start_a_process(refusals, start):
    with pytest.raises(tiers.StartsAProcess, match="not marked slow started a process.*mark it @pytest.mark.slow"):
        start()
    assert len(refusals) == 1 and __file__ in refusals[0]   # names the test's own line, not subprocess.py


def test_a_thread_the_test_starts_is_watched_too(refusals):
    refused = []

    def start():
        try:
            subprocess.run(["true"])
        except tiers.StartsAProcess as e:
            refused.append(e)

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    assert refused and refusals


def test_the_guard_is_gone_after_the_block():
    real = subprocess.Popen._execute_child
    found: list[str] = []
    with tiers.watch(found):
        assert subprocess.Popen._execute_child is not real
    assert subprocess.Popen._execute_child is real and found == []


def test_an_except_exception_cannot_swallow_the_refusal(refusals):
    with pytest.raises(tiers.StartsAProcess):
        try:
            subprocess.run(["true"])
        except Exception:   # what code under test might do around a subprocess
            pass
    assert refusals


def _item(fixtures, slow):
    return SimpleNamespace(nodeid="tests/x.py::t", fixturenames=fixtures,
                           get_closest_marker=lambda name: object() if slow and name == "slow" else None)


def test_a_fast_test_on_a_running_ray_is_found_at_setup():
    assert tiers.collection_problems([_item(["tmp_path", "ray_cluster"], slow=False)]) == [
        f"tests/x.py::t uses ray_cluster (a running Ray) but is not marked slow: {tiers.HINT}"]
    assert tiers.collection_problems([_item(["ray_cluster"], slow=True), _item(["tmp_path"], slow=False)]) == []


def test_the_suite_command_runs_both_tiers_and_prints_the_slowest():
    script = (REPO / "scripts" / "test.sh").read_text()
    command = next(line for line in script.splitlines() if line.startswith(".venv/bin/python -m pytest"))
    assert "--durations=25" in command and "not slow" not in command
    assert 'if [ "$rc" -eq 5 ]' in script   # no tests collected stays a failure
