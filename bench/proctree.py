"""Memory and CPU of a whole process tree, sampled from /proc (Linux), for the benchmarks.

A training run is many processes: the controller, Ray's daemons (GCS, raylet, agents), the
worker ranks, the reward pool. `TreeSampler(root_pid)` walks the descendants of `root_pid` every
`interval_s` and keeps:
  - peak RSS summed over the tree (each process's resident pages; pages shared between processes,
    such as libtorch's code, are counted once per process, so this over-states a tree's footprint)
  - peak PSS summed over the tree (shared pages split between their users: the tree's real share
    of the machine's memory; slower to read, so sampled every `pss_every` samples)
  - CPU seconds used by the tree, so `foreign_cores(t0, t1)` = cores other tenants of the VM used
    (/proc/stat busy time minus our tree's time, as ../shared/bench/workload.py's HostLoad does for
    one process; HostLoad's getrusage misses grandchildren such as Ray workers).
"""

from __future__ import annotations

import os
import threading
import time

PAGE = os.sysconf("SC_PAGE_SIZE")
TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds user+system) of a live process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICK


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * PAGE
    except (FileNotFoundError, ProcessLookupError):
        return 0


def _pss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        pass
    return 0


def part_of(pid: int, root: int) -> str:
    """Which part of a training run a process is: controller, worker rank, Ray daemon, reward pool."""
    if pid == root:
        return "controller"
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
    except (FileNotFoundError, ProcessLookupError):
        return "other"
    if cmd.startswith("ray::") and "Agent" not in cmd:
        return "worker ranks"
    if "multiprocessing" in cmd:
        return "reward pool"
    if "/ray/" in cmd or cmd.startswith("ray::"):
        return "Ray daemons"
    return "other"


def machine_busy_s() -> float:
    """CPU seconds all cores of the machine have been busy since boot."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return (sum(v[:8]) - v[3] - v[4]) / TICK


def tree(root: int) -> dict[int, float]:
    """pid -> CPU seconds for `root` and all its live descendants."""
    info = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            st = _stat(int(name))
            if st:
                info[int(name)] = st
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in info.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {}, [root]
    while todo:
        pid = todo.pop()
        if pid in info:
            out[pid] = info[pid][1]
            todo.extend(children.get(pid, []))
    return out


class TreeSampler:
    """Background sampler of a process tree's memory and CPU; use as a context manager."""

    def __init__(self, root_pid: int, interval_s: float = 0.25, pss_every: int = 4):
        self.root, self.interval, self.pss_every = root_pid, interval_s, pss_every
        self.peak_rss = self.peak_pss = 0
        self.peak_parts: dict[str, int] = {}  # RSS per part_of() at the moment of peak_rss
        self.samples: list[tuple[float, float, float]] = []  # (time, machine busy s, tree CPU s)
        self._cpu: dict[int, float] = {}   # last CPU seconds seen per pid (kept after it exits)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> "TreeSampler":
        self._sample(0)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample(0)

    def _loop(self) -> None:
        i = 0
        while not self._stop.wait(self.interval):
            i += 1
            self._sample(i)

    def _sample(self, i: int) -> None:
        pids = tree(self.root)
        self._cpu.update(pids)
        rss = {p: _rss(p) for p in pids}
        if sum(rss.values()) > self.peak_rss:
            self.peak_rss = sum(rss.values())
            self.peak_parts = {}
            for p, r in rss.items():
                part = part_of(p, self.root)
                self.peak_parts[part] = self.peak_parts.get(part, 0) + r
        if i % self.pss_every == 0:
            self.peak_pss = max(self.peak_pss, sum(_pss(p) for p in pids))
        self.samples.append((time.perf_counter(), machine_busy_s(), sum(self._cpu.values())))

    def foreign_cores(self, t0: float, t1: float) -> float:
        """Cores used by processes outside the tree between perf_counter times t0 and t1."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2:
            return float("nan")
        (a, busy_a, own_a), (b, busy_b, own_b) = inside[0], inside[-1]
        return max(0.0, ((busy_b - busy_a) - (own_b - own_a)) / (b - a))

    def tree_cores(self, t0: float, t1: float) -> float:
        """Cores used by the tree itself between t0 and t1."""
        inside = [s for s in self.samples if t0 <= s[0] <= t1]
        if len(inside) < 2:
            return float("nan")
        return (inside[-1][2] - inside[0][2]) / (inside[-1][0] - inside[0][0])


def idle_probe(seconds: float = 2.0) -> float:
    """Cores busy on the machine (all tenants) over `seconds`, with this process idle."""
    t0, b0 = time.perf_counter(), machine_busy_s()
    time.sleep(seconds)
    return (machine_busy_s() - b0) / (time.perf_counter() - t0)
