#!/usr/bin/env python3
"""LoRA against full fine-tuning on the arith task with SmolLM2-135M-Instruct: one run per call.

  .venv/bin/python bench/lora_learning.py --model-dir DIR --variant full|r16|r1 --seed 0 [--steps 12]
        [--root /tmp/lora-learning] [--json results.jsonl] [--stop-after S]

  full  the recipe grpo-arith-smollm2-cpu (full fine-tuning, actor.lr 2e-5)
  r16   the recipe grpo-arith-smollm2-lora-cpu (rank 16, alpha 32, every linear layer, actor.lr 2e-4)
  r1    the same at rank 1 (alpha 16: alpha / rank at the validate limit of 16), actor.lr 2e-4

Each run is `rlctl train` of the recipe as `rlctl init` writes it (the hf engine, one worker), validation
off, then `rlctl eval RUN --data data/arith/test.parquet` (greedy, 16 tokens: the recipe's held-out
figure, its `number` metric: the right sum's number in the answer). Appends one JSON line: the variant,
seed, median step time, mean reward of the first and last 3 steps, and the held-out number share.

`--stop-after S` (a time-limited lock): S seconds after the start, rlctl alone gets SIGTERM (not the
process group: Ray's own processes must outlive it), ends its step, saves a checkpoint and exits 143;
the same command again continues the run with `rlctl resume` (the steps done are kept).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

START = time.monotonic()
VARIANTS = {"full": ("grpo-arith-smollm2-cpu", []),
            "r16": ("grpo-arith-smollm2-lora-cpu", []),
            "r1": ("grpo-arith-smollm2-lora-cpu", ["model.lora.rank=1", "model.lora.alpha=16"])}


def rlctl(*args, cwd, stop_at: float | None = None) -> str:
    """Run `rlctl ARGS`; past `stop_at` (time.monotonic) it gets SIGTERM and should exit 143 after a checkpoint."""
    proc = subprocess.Popen([sys.executable, "-m", "rlctl", *map(str, args)], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")})
    try:
        out, err = proc.communicate(timeout=None if stop_at is None else max(1.0, stop_at - time.monotonic()))
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate()
    if proc.returncode == 143:   # SIGTERM: the step ended and a checkpoint was saved
        raise SystemExit(f"rlctl {args[0]} stopped after a checkpoint; run the same command again to continue")
    if proc.returncode != 0:
        raise SystemExit(f"rlctl {' '.join(map(str, args))} failed:\n{err[-2000:]}")
    return out


def train(proj: Path, run: Path, overrides: list[str], a) -> None:
    """`rlctl train`, or `rlctl resume` of a run an earlier call left stopped at a checkpoint."""
    done = len((run / "metrics.jsonl").read_text().splitlines()) if (run / "metrics.jsonl").is_file() else 0
    stop_at = None if a.stop_after is None else START + a.stop_after
    if done >= a.steps:
        return
    if any((run / "checkpoints").glob("step_*")):
        rlctl("resume", run, cwd=proj, stop_at=stop_at)
    else:
        rlctl("train", f"run.seed={a.seed}", f"run.total_steps={a.steps}", "data.val_files=[]", *overrides, cwd=proj,
              stop_at=stop_at)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model-dir", required=True)
    p.add_argument("--variant", choices=sorted(VARIANTS), required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--root", default="/tmp/lora-learning")
    p.add_argument("--json")
    p.add_argument("--stop-after", type=float, help="seconds; then stop training at a checkpoint (see above)")
    a = p.parse_args()
    recipe, overrides = VARIANTS[a.variant]
    proj = Path(a.root) / f"{a.variant}-{a.seed}"
    run = proj / "runs" / recipe
    if not (proj / "rlctl.toml").is_file():
        proj.parent.mkdir(parents=True, exist_ok=True)
        rlctl("init", proj, "--recipe", recipe, "--model", Path(a.model_dir).resolve(), cwd=proj.parent)
        rlctl("data", "prep", "arith", "--val-fraction", "0.25", cwd=proj)
    train(proj, run, overrides, a)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads(rlctl("eval", run, "--data", "data/arith/test.parquet", "--format", "json",
                               "--out", proj / "eval.jsonl", cwd=proj))
    rewards = [r["reward/mean"] for r in rows]
    result = {"variant": a.variant, "seed": a.seed, "steps": len(rows),
              "step_s_median": statistics.median(r["timing/step_s"] for r in rows),
              "reward_first3": sum(rewards[:3]) / 3, "reward_last3": sum(rewards[-3:]) / 3,
              "held_out": summary["all"]}   # accuracy, mean reward and the reward's own `number` metric
    print(json.dumps(result))
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(result) + "\n")


if __name__ == "__main__":
    main()
