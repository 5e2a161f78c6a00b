#!/usr/bin/env python3
"""On-policy distillation vs GRPO on CPU, same student, same step budget, through the CLI.

  .venv/bin/python bench/opd_bench.py [--work /tmp/opd-bench] [--steps 100] [--teacher DIR] [--seeds 1]
                                      [--first-seed 1] [--student DIR] [--run-seed 42]

1. Teacher (skipped with --teacher): the demo's pipeline (scripts/demo.sh): `rlctl model tiny
   --layers 2 --hidden 128`, SFT on 150 labelled arith sums (recipe sft-arith-cpu, 300 steps), then
   GRPO from it (recipe grpo-arith-cpu, exact-match reward, the demo's overrides, 300 steps), merged.
2. Student: a fresh `rlctl model tiny --layers 2 --hidden 128 --seed S` (random weights), S = 1, ...
3. From that student, --steps steps each of recipe opd-arith-cpu with distill.loss = "k1" (the
   policy-gradient form), with "forward_kl_topk", and recipe grpo-arith-cpu (the task reward
   alone), all with grpo-arith-cpu's from-scratch optimizer settings (lr 3e-3, one update per batch
   of 16 prompts x 8 samples); every run merged.
   With --student DIR (the SFT model the teacher started from), that student instead, every run with
   the demo's fine-tuning settings (lr 2e-4, 2 PPO epochs, mini-batches of 8; GRPO also with its
   exact-match reward and KL loss 0.05), as in the second stage of scripts/demo.sh.
4. `rlctl eval` (greedy, 8 new tokens) of the teacher, the fresh student and each trained student
   on the 100 held-out sums none of them trained on.

Prints one table: held-out exact accuracy and mean reward (the built-in arith reward, partial credit
for close all-digit answers, the same for every model) and each run's wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO)}
FRESH_OPT = ["actor.lr=3e-3", "actor.ppo_epochs=1", "actor.mini_batch_size=16"]
DEMO_OPT = ["actor.lr=2e-4", "actor.ppo_epochs=2", "actor.mini_batch_size=8"]
DEMO_GRPO = ["reward.function=arith_exact", "actor.lr=2e-4", "actor.ppo_epochs=2", "actor.mini_batch_size=8",
             "actor.kl_loss_coef=0.05", "run.total_steps=300", "data.val_batch_size=100"]


def rlctl(*args: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "rlctl", *args], cwd=cwd, env=ENV, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"rlctl {' '.join(args)} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


def project(work: Path, name: str, recipe: str, model: Path, *prep: str) -> Path:
    folder = work / name
    if not folder.exists():
        rlctl("init", str(folder), "--recipe", recipe, "--model", str(model), cwd=work)
        rlctl("data", "prep", "arith", *prep, cwd=folder)
    return folder


def train(folder: Path, recipe: str, out: Path, overrides: list[str]) -> float:
    """rlctl train + merge; the wall time of the training."""
    start = time.time()
    rlctl("train", *overrides, "run.save_every=0", cwd=folder)
    seconds = time.time() - start
    rlctl("merge", f"runs/{recipe}", "--to-hf", str(out), cwd=folder)
    return seconds


def evaluate(model: Path, data: Path) -> dict:
    out = rlctl("eval", str(model), "--data", str(data), "--max-new-tokens", "8", "--format", "json", "--reward", "",
                "--out", str(model) + ".eval.jsonl", cwd=model.parent)
    return json.loads(out)["all"]


def build_teacher(work: Path) -> Path:
    models = work / "models"
    rlctl("model", "tiny", str(models / "base"), "--layers", "2", "--hidden", "128", cwd=work)
    sft = project(work, "sft", "sft-arith-cpu", models / "base", "--sft", "--limit", "150", "--val-fraction", "0.25")
    train(sft, "sft-arith-cpu", models / "sft", ["run.total_steps=300"])
    grpo = project(work, "grpo", "grpo-arith-cpu", models / "sft", "--val-fraction", "0.25")
    train(grpo, "grpo-arith-cpu", models / "teacher", DEMO_GRPO)
    return models / "teacher"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/opd-bench"))
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--teacher", type=Path, help="a merged teacher folder (skip building one)")
    ap.add_argument("--seeds", type=int, default=1, help="students (fresh models, seeds first..first+N-1) per method")
    ap.add_argument("--first-seed", type=int, default=1)
    ap.add_argument("--run-seed", type=int, default=42, help="run.seed of every training run (sampling, data order)")
    ap.add_argument("--student", type=Path, help="a trained student folder (e.g. the SFT model) instead of fresh ones; "
                                                 "all runs then use the demo's GRPO optimizer settings")
    args = ap.parse_args()
    work = args.work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    teacher = args.teacher.resolve() if args.teacher else build_teacher(work)
    held_out = project(work, "heldout", "sft-arith-cpu", teacher, "--sft", "--limit", "150",
                       "--val-fraction", "0.25") / "data" / "arith-sft" / "test.parquet"
    table = [("teacher (SFT + GRPO)", evaluate(teacher, held_out), 0.0)]
    steps = [f"run.total_steps={args.steps}", f"run.seed={args.run_seed}"]
    students = [(f"student {seed}", work / "models" / f"student{seed}", seed)
                for seed in range(args.first_seed, args.first_seed + args.seeds)]
    if args.student:   # a trained student (the SFT model): the demo's fine-tuning optimizer settings for all
        students, steps = [("SFT student", args.student.resolve(), 0)], steps + DEMO_OPT
    else:              # a fresh student: grpo-arith-cpu's from-scratch settings for all
        steps += FRESH_OPT
    for label, student, seed in students:
        if not student.exists():
            rlctl("model", "tiny", str(student), "--layers", "2", "--hidden", "128", "--seed", str(seed), cwd=work)
        table.append((f"{label} before", evaluate(student, held_out), 0.0))
        grpo = DEMO_GRPO[:1] + DEMO_GRPO[4:5] if args.student else []   # exact reward, KL 0.05, as the demo
        runs = [("OPD k1", "opd-arith-cpu", [f"distill.teacher={teacher}", "distill.loss=k1"]),
                ("OPD forward_kl_topk", "opd-arith-cpu", [f"distill.teacher={teacher}", "distill.loss=forward_kl_topk"]),
                ("GRPO (task reward)", "grpo-arith-cpu", grpo)]
        for run_label, recipe, extra in runs:
            name = f"{recipe}-{run_label.split()[-1].strip('()')}-{seed}"
            folder = project(work, name, recipe, student, "--val-fraction", "0.25")
            out = work / "models" / name
            seconds = train(folder, recipe, out, steps + extra)
            table.append((f"{label} after {args.steps} steps {run_label}", evaluate(out, held_out), seconds))
    print(f"\nheld-out exact accuracy, 100 unseen arith sums, greedy (work folder {work})")
    print(f"{'model':<52} {'accuracy':>8} {'reward':>8} {'train s':>8}")
    for label, result, seconds in table:
        print(f"{label:<52} {result['accuracy']:>8.3f} {result['mean_reward']:>8.3f} {seconds:>8.0f}")


if __name__ == "__main__":
    main()
