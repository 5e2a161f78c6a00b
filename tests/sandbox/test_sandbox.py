"""The sandbox against a hostile corpus, with real processes, in both isolation modes.

`ns`: bubblewrap namespaces + limits (skipped only where this machine refuses namespaces).
`limits`: the fallback forced with RLCTL_SANDBOX=limits; each test asserts what that mode claims.
Every program must end within its limit with the test process unharmed.
"""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from rlctl.sandbox import Limits, Session, detect, run
from rlctl.sandbox.isolation import FORCE_ENV

pytestmark = pytest.mark.slow   # starts Ray, trains a run or starts a subprocess

FAST = Limits(wall_s=3.0, cpu_s=3.0, memory_mb=256, processes=16, output_bytes=1 << 16)


@pytest.fixture(params=["ns", "limits"])
def iso(request, monkeypatch):
    detect.cache_clear()
    if request.param == "limits":
        monkeypatch.setenv(FORCE_ENV, "limits")
    found = detect()
    if request.param == "ns" and not found.namespaces:
        pytest.skip(f"no namespaces on this machine: {found.why_no_namespaces}")
    yield found
    detect.cache_clear()


def _no_process_with(marker: str) -> bool:
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(f"/proc/{entry.name}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        return False
            except OSError:
                pass
    return True


def test_correct_wrong_and_syntax_error(iso):
    assert run("print(sum(map(int, input().split())))", "2 3\n", limits=FAST).stdout == "5\n"
    bad = run("print(int(input()) // 0)", "1\n", limits=FAST)
    assert bad.status == "error" and "ZeroDivisionError" in bad.stderr and bad.exit_code == 1
    syntax = run("def f(:\n", limits=FAST)
    assert syntax.status == "error" and "SyntaxError" in syntax.stderr


def test_infinite_loop_times_out(iso):
    r = run("while True:\n    pass\n", limits=FAST)
    assert r.status == "timeout" and r.wall_s < FAST.wall_s + 2


def test_closing_its_output_and_spinning_still_times_out(iso):
    r = run("import os\nos.close(1)\nos.close(2)\nwhile True:\n    pass\n", limits=FAST)
    assert r.status == "timeout" and r.wall_s < FAST.wall_s + 2


def test_process_limit_holds_before_a_real_fork_bomb(iso):
    code = ("import os, time\nn = 0\ntry:\n    for _ in range(100):\n        if os.fork() == 0:\n"
            "            time.sleep(2); os._exit(0)\n        n += 1\nexcept OSError:\n    pass\nprint(n)\n")
    r = run(code, limits=FAST)
    assert r.status == "ok" and int(r.stdout) < FAST.processes


def test_fork_bomb_is_contained(iso):
    assert iso.protections["process limit (fork bombs)"]
    # re-exec with a marker in argv first, so this test finds exactly its own processes afterwards
    code = ("import os, sys\nif len(sys.argv) < 2:\n    os.execv(sys.executable, [sys.executable, 'main.py', "
            "'forkbomb-7f3a'])\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")
    started = time.monotonic()
    r = run(code, limits=FAST)
    assert r.status == "timeout" and time.monotonic() - started < FAST.wall_s + 5
    time.sleep(0.5)
    assert _no_process_with("forkbomb-7f3a")
    pid = os.fork()  # this process still forks
    if pid == 0:
        os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0


def test_huge_allocation_is_a_memory_error(iso):
    r = run("x = bytearray(10 * 1024 ** 3)\nprint(len(x))\n", limits=FAST)
    assert r.status == "memory" and r.stdout == ""


def test_a_gigabyte_of_output_is_cut(iso):
    r = run("import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)\n",
            limits=FAST)
    assert r.status == "output_limit" and len(r.stdout) <= FAST.output_bytes and r.wall_s < FAST.wall_s


def test_no_write_outside_the_directory(iso, tmp_path):
    target = tmp_path / "escaped.txt"
    code = (f"import os\nfor p in [{str(target)!r}, '/usr/escaped.txt', '/etc/escaped.txt']:\n"
            "    try:\n        open(p, 'w').write('x'); print('wrote', p)\n    except OSError as e:\n"
            "        print('denied', p)\nopen('inside.txt', 'w').write('ok'); print('inside ok')\n")
    r = run(code, limits=FAST)
    assert "wrote" not in r.stdout and "inside ok" in r.stdout
    assert not target.exists() and not os.path.exists("/usr/escaped.txt") and not os.path.exists("/etc/escaped.txt")


def test_network_is_unreachable(iso):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    server.settimeout(0.2)
    port = server.getsockname()[1]
    accepted = []

    def accept():
        deadline = time.monotonic() + FAST.wall_s + 1
        while time.monotonic() < deadline:
            try:
                accepted.append(server.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept)
    t.start()
    code = f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint('connected')\n"
    r = run(code, limits=FAST)
    t.join()
    server.close()
    if iso.protections["no network (network namespace)"]:
        assert r.status == "error" and "connected" not in r.stdout and not accepted
    else:  # the fallback says so; the test checks that claim is honest
        assert iso.why_no_namespaces and r.status == "ok" and accepted


def test_callers_environment_is_invisible(iso, monkeypatch):
    monkeypatch.setenv("RLCTL_TEST_SECRET", "hunter2-token")
    r = run("import os\nprint(dict(os.environ))\nprint(open('/proc/1/environ','rb').read() if "
            "__import__('os').path.exists('/proc/1/environ') else '')\n", limits=FAST)
    assert "hunter2-token" not in r.stdout + r.stderr


def test_killing_the_parent_and_the_caller_harms_nothing(iso):
    me = os.getpid()
    code = (f"import os, signal\nfor pid in (os.getppid(), {me}, 1):\n    try:\n        os.kill(pid, signal.SIGKILL)"
            "\n    except OSError as e:\n        print('refused', pid, e.errno)\n")
    run(code, limits=FAST)
    assert os.getpid() == me  # still here: a SIGKILL would have ended the test run


def test_a_child_that_outlives_the_program_is_killed(iso):
    code = ("import subprocess\nsubprocess.Popen(['sleep', '47.25'], stdout=subprocess.DEVNULL, "
            "stderr=subprocess.DEVNULL, start_new_session=True)\nprint('started')\n")
    started = time.monotonic()
    r = run(code, limits=FAST)
    assert r.status == "ok" and "started" in r.stdout and time.monotonic() - started < FAST.wall_s
    time.sleep(0.3)
    assert _no_process_with("47.25")


def test_the_kill_sweep_starts_no_helper_process(iso, monkeypatch):
    """One process per run: as root without namespaces the run's uid is swept from here (pidfds over
    /proc), not by a helper interpreter started as that uid."""
    import subprocess

    started = []

    class Counting(subprocess.Popen):
        def __init__(self, args, *rest, **kwargs):
            started.append(args)
            super().__init__(args, *rest, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", Counting)
    code = ("import subprocess\nsubprocess.Popen(['sleep', '47.5'], stdout=subprocess.DEVNULL, "
            "stderr=subprocess.DEVNULL, start_new_session=True)\n")
    assert run(code, limits=FAST).status == "ok"
    time.sleep(0.3)
    assert _no_process_with("47.5") and len(started) == 1, started


def test_directory_is_fresh_and_deleted(iso):
    r = run("import os\nprint(sorted(os.listdir('.')))\nprint(os.getcwd())\n", limits=FAST)
    assert r.stdout.splitlines()[0] == "['main.py']"
    assert not os.path.exists(r.stdout.splitlines()[1]) or r.stdout.splitlines()[1] == "/sandbox"


def test_session_keeps_files_between_runs(iso):
    with Session(FAST) as s:
        assert s.run("open('state.txt', 'w').write('42')").ok
        assert s.run("print(open('state.txt').read())").stdout == "42\n"
        assert s.run("open('state.txt', 'a').write('7')").ok  # still its own file in a later run
        assert s.run("print(open('state.txt').read())").stdout == "427\n"
        folder = s.workdir
    assert not folder.exists()


def test_limits_mode_reports_what_is_missing(iso):
    protections = iso.protections
    assert protections["process limit (fork bombs)"] and protections["scrubbed environment"]
    assert protections["no network (network namespace)"] == iso.namespaces
