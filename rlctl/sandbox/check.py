"""`rlctl sandbox check`: a short hostile suite on this machine, and which protections hold.

Each probe is a real program run in the sandbox. A probe for a protection that this machine's
mode does not claim (the network without namespaces) is reported as "not protected", not as a
failure; a claimed protection that does not hold is a failure (a bug to report).
"""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
from pathlib import Path

from rlctl.sandbox.isolation import detect
from rlctl.sandbox.run import Limits, run

LIMITS = Limits(wall_s=3.0, cpu_s=3.0, memory_mb=256, processes=16, output_bytes=1 << 16)
CANARY_ENV = "RLCTL_SANDBOX_CANARY"


def run_checks() -> dict:
    """{"mode", "protections", "checks": [{name, protection, passed, claimed, detail}], "ok"}."""
    iso = detect()
    claims = iso.protections
    checks = [
        _check("a correct program runs", None, *_correct()),
        _check("an infinite loop is stopped", "resource limits (cpu, memory, files, output)", *_loop()),
        _check("a fork bomb is contained", "process limit (fork bombs)", *_fork()),
        _check("a 10 GB allocation is refused", "resource limits (cpu, memory, files, output)", *_alloc()),
        _check("an output flood is cut", "resource limits (cpu, memory, files, output)", *_flood()),
        _check("the caller's environment is hidden", "scrubbed environment", *_environment()),
        _check("the network is unreachable", "no network (network namespace)", *_network()),
        _check("host files are hidden and read-only", "host files hidden, system folders read-only (mount namespace)",
               *_files()),
        _check("the caller survives kill attempts", "unprivileged user (cannot signal the caller)", *_kill()),
    ]
    for c in checks:
        c["claimed"] = c["protection"] is None or claims[c["protection"]]
    ok = all(c["passed"] for c in checks if c["claimed"])
    return {"mode": iso.describe(), "namespaces": iso.namespaces, "protections": claims, "checks": checks, "ok": ok}


def _check(name: str, protection: str | None, passed: bool, detail: str) -> dict:
    return {"name": name, "protection": protection, "passed": bool(passed), "detail": detail}


def _correct():
    r = run("print(sum(map(int, input().split())))", "2 40\n", limits=LIMITS)
    return r.stdout == "42\n", f"{r.status}, {r.wall_s:.2f} s"


def _loop():
    r = run("while True:\n    pass\n", limits=LIMITS)
    return r.status == "timeout", f"{r.status} after {r.wall_s:.1f} s"


def _fork():
    code = ("import os, time\nn = 0\ntry:\n    for _ in range(200):\n        if os.fork() == 0:\n"
            "            time.sleep(1); os._exit(0)\n        n += 1\nexcept OSError:\n    pass\nprint(n)\n")
    r = run(code, limits=LIMITS)
    n = int(r.stdout) if r.stdout.strip().isdigit() else -1
    return 0 <= n < LIMITS.processes, f"{n} of 200 forks allowed (limit {LIMITS.processes})"


def _alloc():
    r = run("x = bytearray(10 * 1024 ** 3)\n", limits=LIMITS)
    return r.status == "memory", r.status


def _flood():
    r = run("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n", limits=LIMITS)
    return r.status == "output_limit", f"{r.status}, {len(r.stdout):,} bytes kept"


def _environment():
    os.environ[CANARY_ENV] = "visible"
    try:
        r = run(f"import os\nprint(os.environ.get({CANARY_ENV!r}, 'hidden'))\n", limits=LIMITS)
    finally:
        os.environ.pop(CANARY_ENV, None)
    return r.stdout.strip() == "hidden", r.stdout.strip() or r.status


def _network():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(LIMITS.wall_s)
    accepted: list = []
    thread = threading.Thread(target=lambda: _accept(server, accepted), daemon=True)
    thread.start()
    port = server.getsockname()[1]
    r = run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')\n",
            limits=LIMITS)
    server.close()
    thread.join(LIMITS.wall_s + 1)
    blocked = "connected" not in r.stdout and not accepted
    return blocked, "connection refused" if blocked else "reached a server on the caller's 127.0.0.1"


def _accept(server: socket.socket, accepted: list) -> None:
    try:
        accepted.append(server.accept()[0])
    except OSError:
        pass


def _files():
    with tempfile.TemporaryDirectory(prefix="rlctl-check-") as folder:
        os.chmod(folder, 0o777)  # world-writable and readable: only a mount namespace hides it
        secret = Path(folder) / "secret.txt"
        secret.write_text("canary")
        os.chmod(secret, 0o644)
        target = Path(folder) / "written.txt"
        code = (f"try:\n    print(open({str(secret)!r}).read())\nexcept OSError:\n    print('unreadable')\n"
                f"try:\n    open({str(target)!r}, 'w').write('x')\nexcept OSError:\n    pass\n")
        r = run(code, limits=LIMITS)
        hidden = "canary" not in r.stdout and not target.exists()
    return hidden, "not visible" if hidden else "a world-readable host file was readable or writable"


def _kill():
    me = os.getpid()
    code = (f"import os, signal\nfor pid in (os.getppid(), {me}):\n    try:\n        os.kill(pid, signal.SIGKILL)\n"
            "    except OSError:\n        pass\n")
    run(code, limits=LIMITS)
    time.sleep(0.1)
    return os.getpid() == me, "caller alive"
