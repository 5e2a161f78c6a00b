"""Where a command's CPU time goes, by kind of process: rank processes, pytest workers, Ray's daemons, ...

`bench/cpu_busy.sh` says how busy the cores were; this says who kept them busy. It runs the command,
reads every process's user + system time from /proc once a second, and adds each second's growth to
the process's kind (from its command line, read again while Ray's worker is still "IDLE": the same
process becomes a `WorkerHost` rank when an actor lands on it). Only the command's own processes
count: this script is their subreaper, so Ray's daemons and orphaned children stay in its tree. A
process that lives less than a second, or the last second of one, is missed, so the table slightly
undercounts. Linux only.

    python3 bench/cpu_by_process.py -- bash scripts/test.sh          # the whole suite
    python3 bench/cpu_by_process.py --json out.json -- CMD ARGS...

Printed at the end: core-seconds per kind, its share, how many processes, and the median
core-seconds per process (a rank's median is about what starting one costs when most runs are short).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import time
from collections import defaultdict

from proctree import tree   # bench/ (the script's folder) is on sys.path

INTERVAL_S = 1.0
RESAMPLED = ("ray worker (idle)",)   # kinds whose process may become another kind
PR_SET_CHILD_SUBREAPER = 36
PYTEST = "pytest (tests, in-process controllers)"


def kind(cmdline: str) -> str:
    """A process's kind from its command line (Ray renames its workers `ray::<Actor>.<method>`)."""
    if "ray::WorkerHost" in cmdline:
        return "rank (ray::WorkerHost)"
    if "ray::IDLE" in cmdline or "default_worker.py" in cmdline:
        return "ray worker (idle)"
    if "ray::" in cmdline:
        return "ray actor " + cmdline.split("ray::", 1)[1].split(".")[0].split()[0]
    for marker, name in (("raylet", "raylet"), ("gcs_server", "gcs_server"), ("dashboard", "Ray dashboard/agents"),
                         ("runtime_env", "Ray dashboard/agents"), ("log_monitor", "Ray log monitor"),
                         ("-m rlctl", "rlctl CLI (controller)"), ("rlctl.cli.main", "rlctl CLI (controller)"),
                         ("multiprocessing.spawn", "spawned Python (reward pools, engine cores)"),
                         # an xdist worker starts as execnet's bootstrap line, then names itself
                         ("pytest-xdist", PYTEST), ("exec(eval(sys.stdin.readline()))", PYTEST),
                         ("-m pytest", PYTEST), ("bin/pytest", PYTEST),
                         ("vllm", "vLLM"), ("chrom", "chromium")):
        if marker in cmdline:
            return name
    program = os.path.basename(cmdline.split()[0]) if cmdline.strip() else "?"
    return "python (other)" if "python" in cmdline else f"other ({program})"


def cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def sample(procs: dict[int, dict], ended: list[dict]) -> None:
    """Add each of the command's processes' CPU growth since the last sample to its record (a process
    tree under this script: orphans are reparented to it, the subreaper)."""
    me = os.getpid()
    for pid, cpu in tree(me).items():
        rec = procs.get(pid)
        if rec is not None and cpu < rec["seen"]:   # the pid was reused by a new process
            ended.append(procs.pop(pid))
            rec = None
        if rec is None:
            if pid == me:
                continue
            rec = procs[pid] = {"kind": kind(cmdline(pid)), "cpu": 0.0, "seen": 0.0}
        elif rec["kind"] in RESAMPLED:
            rec["kind"] = kind(cmdline(pid))
        rec["cpu"] += cpu - rec["seen"]
        rec["seen"] = cpu


def reap(command_pid: int) -> int | None:
    """Reap every ended child, the orphans reparented here included: the command's exit code once it
    has ended, else None."""
    code = None
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return code
        if pid == 0:
            return code
        if pid == command_pid:
            code = os.waitstatus_to_exitcode(status)


def table(records: list[dict]) -> list[dict]:
    by_kind: dict[str, list[float]] = defaultdict(list)
    for rec in records:
        if rec["cpu"] > 0:
            by_kind[rec["kind"]].append(rec["cpu"])
    total = sum(sum(v) for v in by_kind.values()) or 1.0
    rows = [{"kind": k, "core_s": sum(v), "share": sum(v) / total, "processes": len(v),
             "median_core_s": statistics.median(v)} for k, v in by_kind.items()]
    return sorted(rows, key=lambda r: -r["core_s"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the table and the wall time here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to measure after --")
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1)   # orphans stay in our tree
    procs: dict[int, dict] = {}
    ended: list[dict] = []
    start = time.monotonic()
    proc = subprocess.Popen(command)
    code = None
    while code is None:
        time.sleep(INTERVAL_S)
        sample(procs, ended)
        code = reap(proc.pid)
    proc.returncode = code   # reaped above: Popen must not wait for it again
    wall = time.monotonic() - start
    rows = [r for r in table(ended + list(procs.values())) if r["core_s"] >= 1.0]
    print(f"\n{'kind':46} {'core-s':>8} {'share':>6} {'procs':>6} {'median':>7}   (wall {wall:.0f} s)")
    for r in rows:
        print(f"{r['kind'][:46]:46} {r['core_s']:8.0f} {r['share']:6.1%} {r['processes']:6d} {r['median_core_s']:7.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "wall_s": wall, "rows": rows}, f, indent=1)
    return code


if __name__ == "__main__":
    sys.exit(main())
