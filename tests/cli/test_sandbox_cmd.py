"""`rlctl sandbox check` and the doctor's sandbox line, as a user runs them (real subprocesses)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]   # the sandbox runs programs in subprocesses


def rlctl(*args, **env):
    return subprocess.run([sys.executable, "-m", "rlctl", *args], capture_output=True, text=True, timeout=240,
                          env={**os.environ, **env})


def test_check_passes_and_reports_every_protection():
    proc = rlctl("sandbox", "check", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["ok"] and len(report["checks"]) >= 9
    names = {c["name"]: c for c in report["checks"]}
    assert names["a fork bomb is contained"]["passed"] and names["an infinite loop is stopped"]["passed"]
    if report["namespaces"]:
        assert all(c["passed"] for c in report["checks"]) and all(report["protections"].values())


def test_check_in_limits_mode_says_what_is_missing():
    proc = rlctl("sandbox", "check", RLCTL_SANDBOX="limits")
    assert proc.returncode == 0, proc.stderr
    assert "resource limits only" in proc.stdout and "not protected" in proc.stdout
    assert "SANDBOX WITHOUT NAMESPACES" in proc.stderr and proc.stderr.count("SANDBOX WITHOUT NAMESPACES") == 1


def test_doctor_shows_the_sandbox_mode():
    plain = rlctl("doctor", "--format", "json")
    assert plain.returncode == 0, plain.stderr
    assert "namespaces" in json.loads(plain.stdout)["sandbox"]
    fallback = rlctl("doctor", RLCTL_SANDBOX="limits")
    assert "sandbox: WARNING" in fallback.stdout and "no network" in fallback.stdout
