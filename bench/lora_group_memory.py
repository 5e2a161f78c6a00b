#!/usr/bin/env python3
"""Peak memory of several LoRA runs on one base (`rlctl train --seeds 0,1,2`) against one run and
against the same runs as separate processes, on the LoRA recipe.

  PYTHONPATH=. .venv/bin/python bench/lora_group_memory.py --model-dir DIR [--runs 3] [--steps 2]
        [--root /tmp/lora-group-memory] [--only one|group|separate] [--json results.jsonl]

  one       `rlctl train` of grpo-arith-smollm2-lora-cpu, run.seed=0
  group     `rlctl train --seeds 0,...,runs-1`: the runs in one controller and one worker rank
  separate  `--runs` `rlctl train` processes at once, run.seed=0, 1, ...: each its own Ray and rank

Every run: --steps steps, validation off, resources.cpus_per_worker=1 (the same threads in every
case). Each case's process trees are sampled from /proc every 0.25 s (bench/proctree.py): the peak
RSS and PSS summed over every process (controller, Ray's daemons, worker ranks, reward pool) and the
worker ranks' RSS at that peak, where the base model lives. Prints one JSON line per case.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from proctree import TreeSampler  # noqa: E402

RECIPE = "grpo-arith-smollm2-lora-cpu"
RUN = ["data.val_files=[]", "resources.cpus_per_worker=1"]
MB = 1e6


def rlctl(*args, cwd) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "rlctl", *map(str, args)], cwd=cwd, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def finished(proc: subprocess.Popen, what: str) -> None:
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed (exit {proc.returncode}):\n{err[-2000:]}")


def project(root: Path, name: str, model_dir: str) -> Path:
    proj = root / name
    if not (proj / "rlctl.toml").exists():
        root.mkdir(parents=True, exist_ok=True)
        finished(rlctl("init", proj, "--recipe", RECIPE, "--model", model_dir, cwd=root), "rlctl init")
        finished(rlctl("data", "prep", "arith", cwd=proj), "rlctl data prep")
    shutil.rmtree(proj / "runs", ignore_errors=True)   # a new run each time
    return proj


def measure(case: str, procs: list[subprocess.Popen]) -> dict:
    """Wait for `procs`, sampling each one's process tree; the sums of the trees' peaks."""
    samplers = [TreeSampler(p.pid).__enter__() for p in procs]
    start = time.perf_counter()
    for i, proc in enumerate(procs):
        finished(proc, f"{case} run {i}")
    for s in samplers:
        s.__exit__(None, None, None)
    return {"case": case, "runs": len(procs), "wall_s": round(time.perf_counter() - start, 1),
            "peak_rss_mb": round(sum(s.peak_rss for s in samplers) / MB),
            "peak_pss_mb": round(sum(s.peak_pss for s in samplers) / MB),
            "worker_rss_mb": round(sum(s.peak_parts.get("worker ranks", 0) for s in samplers) / MB)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--root", default="/tmp/lora-group-memory")
    p.add_argument("--only", choices=["one", "group", "separate"], action="append")
    p.add_argument("--json")
    a = p.parse_args()
    root = Path(a.root)
    run = [*RUN, f"run.total_steps={a.steps}"]
    seeds = list(range(a.runs))
    for case in a.only or ["one", "group", "separate"]:
        if case == "one":
            proj = project(root, "one", a.model_dir)
            procs = [rlctl("train", *run, "run.seed=0", cwd=proj)]
        elif case == "group":
            proj = project(root, "group", a.model_dir)
            procs = [rlctl("train", *run, "--seeds", ",".join(map(str, seeds)), cwd=proj)]
        else:
            procs = [rlctl("train", *run, f"run.seed={s}", cwd=project(root, f"separate-{s}", a.model_dir))
                     for s in seeds]
        result = measure(case, procs)
        print(json.dumps(result), flush=True)
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
