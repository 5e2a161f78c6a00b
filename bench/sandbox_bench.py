"""Sandboxed executions per second: the `code` reward's throughput on this machine.

Runs N small stdin/stdout programs (read two ints, print the sum: the typical cost of one test
case is the sandbox, not the program) three ways, each the median of --rounds:
  run        rlctl.sandbox.run from a thread pool of --threads (the raw sandbox)
  reward     the code reward through rlctl's RewardRunner with reward.workers = --workers,
             one sample = one program x 1 case (what a training step does)
in both isolation modes (bubblewrap namespaces, and the limits-only fallback via RLCTL_SANDBOX).

    python bench/sandbox_bench.py --programs 200 --threads 2 --workers 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

CODE = "a, b = map(int, input().split())\nprint(a + b)\n"


def bench_run(programs: int, threads: int) -> float:
    from rlctl.sandbox import run

    def one(i: int) -> bool:
        return run(CODE, f"{i} {i}\n").stdout == f"{2 * i}\n"

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        ok = sum(pool.map(one, range(programs)))
    elapsed = time.perf_counter() - start
    assert ok == programs, f"only {ok} of {programs} programs passed"
    return programs / elapsed


def bench_reward(programs: int, workers: int) -> float:
    from rlctl.rewards.runner import RewardRunner

    truth = json.dumps({"inputs": ["3 4\n"], "outputs": ["7\n"]})
    items = [{"data_source": "rlctl/code", "solution_str": f"```python\n{CODE}```", "ground_truth": truth}
             for _ in range(programs)]
    with RewardRunner("", Path(tempfile.gettempdir()), timeout_s=60, on_error="fail", workers=workers) as rr:
        rr.score(items[:workers])  # warm: workers started and the sandbox probed
        start = time.perf_counter()
        result = rr.score(items)
        elapsed = time.perf_counter() - start
    assert float(result.scores.mean()) == 1.0
    return programs / elapsed


def load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} / {five:.2f} on {os.cpu_count()} CPUs"


def child(args) -> None:
    from rlctl.sandbox import detect

    rounds = {"run": [], "reward": []}
    for _ in range(args.rounds):
        rounds["run"].append(bench_run(args.programs, args.threads))
        rounds["reward"].append(bench_reward(args.programs, args.workers))
    print(json.dumps({"mode": detect().describe(), **{k: statistics.median(v) for k, v in rounds.items()}}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--programs", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    print(f"{args.programs} programs, {args.threads} threads (run) / {args.workers} reward workers; {load()}")
    for mode in ("namespaces", "limits"):
        env = {**os.environ, **({"RLCTL_SANDBOX": "limits"} if mode == "limits" else {})}
        out = subprocess.run([sys.executable, __file__, "--child", *sys.argv[1:]], env=env, capture_output=True,
                             text=True, check=True).stdout.strip().splitlines()[-1]
        r = json.loads(out)
        print(f"{mode:>10}: run {r['run']:6.1f} exec/s   reward {r['reward']:6.1f} exec/s   ({r['mode'][:60]})")
    print(f"after: {load()}")


if __name__ == "__main__":
    main()
