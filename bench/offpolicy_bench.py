#!/usr/bin/env python3
"""One-step off-policy vs synchronous GRPO on this machine's cores, at equal tokens per step.

  .venv/bin/python bench/offpolicy_bench.py [--timing-steps 12 --warmup 2] [--learn-steps 20]
        [--layers 4 --hidden 256] [--batch-size 8 --n 8 --max-response-length 32] [--json out.json]

Every run is `rlctl train`'s own code path (rlctl.controller.run.start_training) in this process
on the same project: the grpo-arith-cpu recipe (arith prompts, its partial-credit reward, KL
loss), a local byte-level Qwen2 model built by rlctl.models.tiny (default 4 layers, hidden 256,
~4M parameters, like ../shared/bench's "tiny"), fp32, seed 0. Same prompts per step, samples,
response cap and optimizer settings; the modes differ only in how the 2 cores are split:

  sync          resources.workers = 2: the actor group generates (2 ranks), then trains (FSDP2, 2 ranks)
  sync_1worker  resources.workers = 1: the same on one rank (the other core idle): one_step_off's actor alone
  one_step_off  resources.workers = 1 + rollout_workers = 1: the rollout rank generates batch k+1
                while the actor rank trains on batch k
  one_step_off_bypass  the same with verl's bypass mode: old_log_prob = the rollout rank's
                log-probs, no recompute pass on the actor

Two phases. Timing (--timing-steps, every mode): actor.lr = 1e-7, so the policy stays the
random initial one and every mode generates the same number of tokens per step (the learning
runs shorten their answers at different speeds, which would change the work per step); median
step time over the steps after --warmup, generated tokens per step and per second, exposed
generation wait, training time. Learning (--learn-steps, --learn-modes): the recipe's
lr, reward/mean per step (the reward curves). Also the foreign CPU load: cores used by other
processes during the measured steps (this machine is shared: read the timings with it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from proctree import TreeSampler, idle_probe  # noqa: E402

MODES = {"sync": ["rollout.mode=sync", "resources.workers=2"],
         "sync_1worker": ["rollout.mode=sync", "resources.workers=1"],
         "one_step_off": ["rollout.mode=one_step_off", "resources.workers=1", "resources.rollout_workers=1"],
         "one_step_off_bypass": ["rollout.mode=one_step_off", "resources.workers=1", "resources.rollout_workers=1",
                                 "algorithm.rollout_correction.bypass_mode=true"]}


def make_project(root: Path, a) -> Path:
    from rlctl.tasks.prep import PrepOptions, prepare
    from rlctl.models.tiny import build_tiny_model
    from rlctl.project import write_project

    model = root / "model"
    build_tiny_model(model, layers=a.layers, hidden=a.hidden, heads=4, kv_heads=2, intermediate=4 * a.hidden)
    write_project(root / "proj", "grpo-arith-cpu", str(model))
    prepare("arith", PrepOptions(out=root / "proj" / "data" / "arith"))
    return root / "proj"


def run_mode(project: Path, mode: str, a, *, steps: int, lr: float | None) -> dict:
    from rlctl.config.loader import load_config
    from rlctl.controller.run import start_training

    name = f"bench-{mode}-{'timing' if lr else 'learn'}"
    overrides = MODES[mode] + [
        f"run.name={name}", f"run.total_steps={steps}", "run.save_every=0", "data.val_files=[]",
        "resources.gpus_per_node=0", "resources.cpus_per_worker=1", f"data.batch_size={a.batch_size}",
        f"rollout.n={a.n}", f"data.max_response_length={a.max_response_length}",
        f"actor.mini_batch_size={a.batch_size}", f"actor.micro_batch_size={a.batch_size * a.n // 2}", "run.seed=0"]
    overrides += [f"actor.lr={lr}"] if lr else []
    t0 = time.perf_counter()
    with TreeSampler(os.getpid()) as sampler:
        start_training(load_config(project / "rlctl.toml", overrides), address=None, force=True)
        t1 = time.perf_counter()
    rows = [json.loads(line) for line in (project / "runs" / name / "metrics.jsonl").read_text().splitlines()]
    measured = rows[a.warmup:]
    # the measured steps end at t1 (the run's last step); they span the sum of their step times
    span = sum(r["timing/step_s"] for r in measured)

    def med(key: str) -> float:   # over the steps that log it (the last step pushes no weights); 0 when none
        return statistics.median([r[key] for r in measured if key in r] or [0.0])

    return {"mode": mode, "step_s": med("timing/step_s"), "gen_wait_s": med("timing/gen_s") - med("timing/reward_s"),
            "train_s": med("timing/update_actor_s"), "old_log_prob_s": med("timing/old_log_prob_s"),
            "ref_s": med("timing/ref_s"), "sync_weights_s": med("timing/sync_weights_s"),
            "gen_tokens": statistics.mean(r["response_length/mean"] * r["data/sequences"] for r in measured),
            "tokens_per_s": sum(r["response_length/mean"] * r["data/sequences"] for r in measured) / span,
            "foreign_cores": sampler.foreign_cores(t1 - span, t1), "wall_s": t1 - t0,
            "rewards": [round(r["reward/mean"], 4) for r in rows],
            "staleness": [r.get("rollout/staleness", 0.0) for r in rows]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--timing-steps", type=int, default=12)
    p.add_argument("--learn-steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-response-length", type=int, default=32)
    p.add_argument("--modes", default="sync,sync_1worker,one_step_off,one_step_off_bypass")
    p.add_argument("--learn-modes", default="sync,one_step_off,one_step_off_bypass")
    p.add_argument("--json", default="")
    a = p.parse_args()
    print(f"foreign CPU load before: {max(0.0, idle_probe(2.0)):.2f} cores busy (this process idle)", flush=True)
    timing, learning = [], []
    with tempfile.TemporaryDirectory(prefix="rlctl-offpolicy-bench-") as tmp:
        project = make_project(Path(tmp), a)
        for mode in filter(None, a.modes.split(",")):
            timing.append(run_mode(project, mode, a, steps=a.timing_steps, lr=1e-7))
            print(f"timing {mode}: done in {timing[-1]['wall_s']:.0f} s", flush=True)
        for mode in filter(None, a.learn_modes.split(",")):
            learning.append(run_mode(project, mode, a, steps=a.learn_steps, lr=None))
            print(f"learning {mode}: done in {learning[-1]['wall_s']:.0f} s", flush=True)
    print(f"\n{a.batch_size} prompts x {a.n} samples, <= {a.max_response_length} new tokens, {a.layers} layers x "
          f"hidden {a.hidden}; timing: median of steps {a.warmup + 1}..{a.timing_steps} at lr 1e-7")
    print("| mode | step s | vs sync | gen tokens/step | gen tok/s | gen wait s | train s | old logp s | "
          "weight push s | foreign cores |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in timing:
        print(f"| {r['mode']} | {r['step_s']:.2f} | {timing[0]['step_s'] / r['step_s']:.2f}x | {r['gen_tokens']:.0f} | "
              f"{r['tokens_per_s']:.0f} | {r['gen_wait_s']:.2f} | {r['train_s']:.2f} | {r['old_log_prob_s']:.2f} | "
              f"{r['sync_weights_s']:.3f} | {r['foreign_cores']:.2f} |")
    if learning:
        print(f"\nreward/mean per step (recipe lr), steps 1..{a.learn_steps}:")
        for r in learning:
            print(f"  {r['mode']:>12}: " + " ".join(f"{x:.3f}" for x in r["rewards"]) +
                  f"   (median step {r['step_s']:.2f} s, foreign {r['foreign_cores']:.2f} cores)")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "timing": timing, "learning": learning}, indent=1) + "\n")


if __name__ == "__main__":
    main()
