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

TICKS = os.sysconf("SC_CLK_TCK")
INTERVAL_S = 1.0
RESAMPLED = ("ray worker (idle)",)   # kinds whose process may become another kind
PR_SET_CHILD_SUBREAPER = 36
PYTEST = "pytest (tests, in-process controllers)"


def kind(cmdline: str, comm: str) -> str:
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
    return "python (other)" if "python" in cmdline else f"other ({comm})"


def read(pid: str) -> tuple[tuple[str, str], float, str, str] | None:
    """((pid, start time), CPU seconds, comm, parent pid) of a live process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    comm = stat[stat.index("(") + 1:stat.rindex(")")]
    fields = stat[stat.rindex(")") + 2:].split()
    return (pid, fields[19]), (int(fields[11]) + int(fields[12])) / TICKS, comm, fields[1]


def cmdline(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def sample(seen: dict, procs: dict, ours: set[str]) -> None:
    """Add each of the command's processes' CPU growth since the last sample to its record. `ours`: the
    pids of this script and of the command's processes, a process is ours when its parent is."""
    for pid in sorted(filter(str.isdigit, os.listdir("/proc")), key=int):   # parents before children, mostly
        got = read(pid)
        if got is None:
            continue
        key, cpu, comm, parent = got
        rec = procs.get(key)
        if rec is None:
            if parent not in ours:
                continue
            ours.add(pid)
            rec = procs[key] = {"kind": kind(cmdline(pid), comm), "cpu": 0.0}
        elif rec["kind"] in RESAMPLED:
            rec["kind"] = kind(cmdline(pid), comm)
        rec["cpu"] += cpu - seen.get(key, 0.0)
        seen[key] = cpu


def reap_orphans(command_pid: int) -> None:
    """Reap the orphans reparented to this script (their CPU was counted while they ran); the command
    itself is left to Popen, which needs its exit code."""
    me = str(os.getpid())
    for pid in filter(str.isdigit, os.listdir("/proc")):
        got = read(pid)
        if got is not None and got[3] == me and int(pid) != command_pid:
            try:
                os.waitpid(int(pid), os.WNOHANG)
            except ChildProcessError:
                pass


def table(procs: dict) -> list[dict]:
    by_kind: dict[str, list[float]] = defaultdict(list)
    for rec in procs.values():
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
    seen: dict = {}
    procs: dict = {}
    ours = {str(os.getpid())}
    start = time.monotonic()
    proc = subprocess.Popen(command)
    while proc.poll() is None:
        time.sleep(INTERVAL_S)
        sample(seen, procs, ours)
        reap_orphans(proc.pid)
    wall = time.monotonic() - start
    rows = [r for r in table(procs) if r["core_s"] >= 1.0]
    print(f"\n{'kind':46} {'core-s':>8} {'share':>6} {'procs':>6} {'median':>7}   (wall {wall:.0f} s)")
    for r in rows:
        print(f"{r['kind'][:46]:46} {r['core_s']:8.0f} {r['share']:6.1%} {r['processes']:6d} {r['median_core_s']:7.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": command, "wall_s": wall, "rows": rows}, f, indent=1)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
