"""Seconds to start and stop an embedded Ray: a plain `ray.init` (what tests/conftest.py's ray_cluster
fixture did before) vs rlctl's `ray_session` (no autoscaler monitor, log monitor, API server or prestarted
idle workers; what `rlctl train` and now the fixture use). Alternating rounds, so both see the same load.

    OMP_NUM_THREADS=1 RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled python bench/ray_start_bench.py --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def plain() -> tuple[float, float]:
    import ray

    os.environ.pop("RAY_prestart_worker_first_driver", None)   # ray_session sets it for the whole process
    start = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    up = time.perf_counter()
    ray.shutdown()
    return up - start, time.perf_counter() - up


def lean() -> tuple[float, float]:
    from rlctl.runtime.ray_env import ray_session

    start = time.perf_counter()
    with ray_session(num_cpus=2, log_to_driver=False):
        up = time.perf_counter()
    return up - start, time.perf_counter() - up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    times: dict[str, list[tuple[float, float]]] = {"ray.init": [], "ray_session": []}
    for _ in range(args.rounds):
        times["ray.init"].append(plain())
        times["ray_session"].append(lean())
    print(f"load average {os.getloadavg()[0]:.1f} (1 min) on {os.cpu_count()} CPUs")
    for name, rows in times.items():
        starts, stops = [s for s, _ in rows], [s for _, s in rows]
        print(f"{name:12s} start: median {statistics.median(starts):5.1f} s (min {min(starts):.1f}, "
              f"max {max(starts):.1f})   stop: median {statistics.median(stops):4.1f} s   ({args.rounds} rounds)")


if __name__ == "__main__":
    main()
