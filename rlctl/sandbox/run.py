"""Run one program in the sandbox and say how it ended.

    result = run("print(input()[::-1])", stdin="abc\\n", limits=Limits(wall_s=2))
    result.status, result.stdout      # "ok", "cba\\n"

Statuses: `ok` (exit 0), `error` (non-zero exit, e.g. an exception or a syntax error), `timeout`
(wall time or CPU time), `memory` (the allocation limit), `output_limit` (stdout + stderr too
long), `sandbox_error` (the sandbox itself could not start: never the program's fault).
Each call is independent and thread-safe: many run at once from a thread or process pool.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from rlctl.sandbox.isolation import Isolation, detect, warn_once
from rlctl.sandbox.jail import JAIL_DIR, bwrap_args, clean_env, launcher

STATUSES = ("ok", "error", "timeout", "memory", "output_limit", "sandbox_error")
MEMORY_MARKERS = ("MemoryError", "Cannot allocate memory", "std::bad_alloc", "out of memory")
# language -> (file the code is written to, argv given the sandbox's python)
LANGUAGES = {"python": ("main.py", lambda python: [python, "-s", "main.py"])}
READ_CHUNK = 1 << 16
KILL_SWEEPS = 20  # rounds of the uid sweep (limits mode as root) before giving up on a fork loop


@dataclass(frozen=True)
class Limits:
    """What one program may use. Memory is address space (RLIMIT_AS), so it also caps threads' stacks."""

    wall_s: float = 5.0
    cpu_s: float = 5.0
    memory_mb: int = 512
    processes: int = 32  # processes and threads of the program, itself included
    open_files: int = 64
    file_mb: int = 16  # largest file it may write
    output_bytes: int = 1 << 20  # stdout + stderr together

    def rlimits(self, nproc: int) -> dict[str, tuple[int, int]]:
        cpu = max(1, int(self.cpu_s + 0.999))
        memory, fsize = self.memory_mb << 20, self.file_mb << 20
        return {"RLIMIT_CPU": (cpu, cpu + 1), "RLIMIT_AS": (memory, memory), "RLIMIT_NPROC": (nproc, nproc),
                "RLIMIT_NOFILE": (self.open_files, self.open_files), "RLIMIT_FSIZE": (fsize, fsize),
                "RLIMIT_CORE": (0, 0)}


@dataclass(frozen=True)
class RunResult:
    status: str
    stdout: str
    stderr: str
    exit_code: int | None  # None when the program was killed (timeout, output_limit) or died by a signal
    wall_s: float
    signal: int | None = None
    isolation: str = field(default="", repr=False)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def run(code: str, stdin: str = "", *, language: str = "python", limits: Limits = Limits(),
        workdir: Path | None = None) -> RunResult:
    """Run `code` with `stdin` in a fresh empty directory (deleted afterwards), or in `workdir`
    (kept: see Session) and return how it ended."""
    return _run(code, stdin, language, limits, workdir, None)


def _run(code: str, stdin: str, language: str, limits: Limits, workdir: Path | None, uid: int | None) -> RunResult:
    """`run`, with the uid a Session keeps for all of its runs (its files stay writable)."""
    if language not in LANGUAGES:
        raise ValueError(f"sandbox language {language!r} is not one of {', '.join(LANGUAGES)}")
    iso = detect()
    warn_once(iso)
    own_dir = workdir is None
    directory = Path(tempfile.mkdtemp(prefix="rlctl-sandbox-")) if own_dir else Path(workdir)
    uid = uid if uid is not None else _uid_for(iso)
    try:
        filename, argv = LANGUAGES[language]
        _prepare(directory, filename, code, uid)
        return _execute(iso, directory, argv(iso.python), stdin, limits, uid)
    finally:
        if own_dir:
            shutil.rmtree(directory, ignore_errors=True)


class Session:
    """A working directory that persists across runs (the `python` tool: one per conversation).

    Files a program writes stay for the next run; `close()` deletes the directory. Every run
    still gets fresh processes, limits and namespaces.
    """

    def __init__(self, limits: Limits = Limits()):
        self.limits = limits
        self.workdir = Path(tempfile.mkdtemp(prefix="rlctl-session-"))
        self._uid = _uid_for(detect())
        if self._uid is not None:
            os.chown(self.workdir, self._uid, self._uid)

    def run(self, code: str, stdin: str = "", *, language: str = "python") -> RunResult:
        if not self.workdir.exists():
            raise RuntimeError("Session.run() after close()")
        return _run(code, stdin, language, self.limits, self.workdir, self._uid)

    def close(self) -> None:
        shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _uid_for(iso: Isolation) -> int | None:
    from rlctl.sandbox.isolation import sandbox_uid

    return sandbox_uid() if iso.as_root else None


def _prepare(directory: Path, filename: str, code: str, uid: int | None) -> None:
    path = directory / filename
    path.write_text(code, encoding="utf-8")
    if uid is not None:  # the sandbox user owns its directory and nothing else
        os.chown(directory, uid, uid)
        os.chown(path, uid, uid)
        os.chmod(directory, 0o700)


def _execute(iso: Isolation, directory: Path, argv: list[str], stdin: str, limits: Limits,
             uid: int | None) -> RunResult:
    nproc = limits.processes if (iso.namespaces or uid is not None) else _own_processes() + limits.processes
    inner = launcher(iso.python, limits.rlimits(nproc), argv)
    if iso.namespaces:
        cmd, cwd, home = [iso.bwrap, *bwrap_args(iso.python, directory), "--", *inner], None, JAIL_DIR
    else:
        cmd, cwd, home = inner, str(directory), str(directory)
    started = time.monotonic()
    try:
        proc = subprocess.Popen(cmd, cwd=cwd, env=clean_env(home), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, user=uid, group=uid,
                                extra_groups=[] if uid is not None else None)
    except OSError as e:
        return RunResult("sandbox_error", "", f"could not start the sandbox: {e}", None, 0.0, None, iso.describe())
    killed, out, err = _communicate(proc, stdin.encode("utf-8"), limits, started, lambda: _kill(proc, iso, uid))
    wall = time.monotonic() - started
    return _result(iso, proc.returncode, killed, out, err, wall)


def _communicate(proc: subprocess.Popen, data: bytes, limits: Limits, started: float, kill) -> tuple:
    """Feed stdin, collect output up to the limit; kill on the wall deadline or too much output.
    Returns (why it was killed or None, stdout bytes, stderr bytes)."""
    threading.Thread(target=_feed, args=(proc.stdin, data), daemon=True).start()
    chunks = {proc.stdout: [], proc.stderr: []}
    total, killed, cleaned = 0, None, False
    deadline = started + limits.wall_s
    with selectors.DefaultSelector() as sel:
        for stream in chunks:
            sel.register(stream, selectors.EVENT_READ)
        # until both pipes closed AND the program ended: one may close its output and go on running
        while sel.get_map() or proc.poll() is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0 and killed is None:
                killed = "timeout"
                kill()
            wait_s = max(0.01, remaining) if killed is None else 0.2
            if not sel.get_map():  # nothing to read: just wait for the exit (or the deadline)
                time.sleep(min(wait_s, 0.05))
            for key, _ in (sel.select(timeout=wait_s) if sel.get_map() else ()):
                chunk = os.read(key.fd, READ_CHUNK)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                total += len(chunk)
                if killed is None and total > limits.output_bytes:
                    killed = "output_limit"
                    kill()
                if total <= limits.output_bytes:
                    chunks[key.fileobj].append(chunk)
            if killed is None and not cleaned and proc.poll() is not None:
                kill()  # the program ended: nothing it left behind may run on (or hold the pipes)
                cleaned = True
            if killed is not None and time.monotonic() > deadline + 5.0:
                break  # a killed program's pipes are closed by now; do not wait on a stray holder
    proc.wait()
    for stream in chunks:
        stream.close()
    return killed, b"".join(chunks[proc.stdout]), b"".join(chunks[proc.stderr])


def _feed(pipe, data: bytes) -> None:
    try:
        pipe.write(data)
    except (BrokenPipeError, OSError):
        pass  # the program did not read all of its input
    finally:
        try:
            pipe.close()
        except OSError:
            pass


def _kill(proc: subprocess.Popen, iso: Isolation, uid: int | None) -> None:
    """Kill the program and everything it started.

    With namespaces, killing bwrap ends its PID namespace, whose processes the kernel kills. Without
    them: the program's session, and as root every process of the run's own uid (those that left
    the session too)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if not iso.namespaces and uid is not None:
        _kill_uid(uid)


def _kill_uid(uid: int) -> None:
    """SIGKILL every process of `uid` (a run's own uid: nothing else has it), found in /proc.

    Each is signalled through a pidfd opened before its owner is checked, so a pid reused by
    another process between the scan and the signal is never hit: a pidfd names one process, not
    a number. Owners are read from /proc/<pid>/status (a process that made itself non-dumpable
    leaves /proc/<pid> owned by root). A fork loop may add processes during a sweep: sweep again
    until one finds none (the run's process limit bounds how many there can be)."""
    for _ in range(KILL_SWEEPS):
        if not any([_kill_if_owned(int(e.name), uid) for e in os.scandir("/proc") if e.name.isdigit()]):
            return


def _kill_if_owned(pid: int, uid: int) -> bool:
    try:
        fd = os.pidfd_open(pid)
    except OSError:
        return False   # gone already
    try:
        with open(f"/proc/{pid}/status") as f:
            fields = dict(line.split(":", 1) for line in f if line.startswith(("State:", "Uid:")))
        if str(uid) not in fields.get("Uid", "").split() or fields.get("State", "").split()[:1] == ["Z"]:
            return False   # not ours, or a zombie (already dead, waiting for its parent)
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return True
    except OSError:   # exited meanwhile
        return False
    finally:
        os.close(fd)


def _own_processes() -> int:
    """Processes of this uid now: without a user namespace or uid of its own, RLIMIT_NPROC counts them too."""
    me, count = os.getuid(), 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                count += entry.stat().st_uid == me
            except OSError:
                pass
    return count


def _result(iso: Isolation, rc: int, killed: str | None, out: bytes, err: bytes, wall: float) -> RunResult:
    stdout, stderr = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    sig = -rc if rc < 0 else (rc - 128 if iso.namespaces and rc > 128 else None)
    code = None if (sig is not None or killed) else rc
    if killed:
        status = killed
    elif iso.namespaces and rc == 1 and stderr.startswith("bwrap: "):
        status = "sandbox_error"
    elif sig in (signal.SIGXCPU, signal.SIGKILL):  # CPU soft then hard limit
        status = "timeout"
    elif rc == 0:
        status = "ok"
    elif any(marker in stderr[-2000:] for marker in MEMORY_MARKERS):
        status = "memory"
    else:
        status = "error"
    return RunResult(status, stdout, stderr, code, round(wall, 4), sig, iso.describe())
