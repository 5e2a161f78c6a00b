#!/usr/bin/env python3
"""Async rollouts with the vLLM and the hf engine in the rollout group, real runs on this machine.

  .venv/bin/python bench/async_vllm_bench.py [--steps 12 --warmup 2] [--layers 4 --hidden 256]
        [--batch-size 8 --n 8 --max-response-length 32 --chunk 8] [--engines hf,vllm] [--json out.json]

Unlike bench/async_bench.py (a simulated long tail, sleeps scheduled by rlctl's real async
source), every run here is `rlctl train`'s own code path in this process: the grpo-arith-cpu
recipe on a local byte-level Qwen2 (rlctl.models.tiny, default 4 x 256: head size 64, which
vLLM's CPU attention runs), fp32, seed 0, actor.lr = 1e-7 so that every mode generates the same
work per step, resources.workers = 1 + rollout_workers = 1 (one core each). Per engine:

  one_step_off        rollout.mode = "one_step_off"
  async K=2           rollout.mode = "async", max_staleness 2, "wait", decoupled_ppo
  async K=2 partial   the same with rollout.partial_rollout = true, rounds of --chunk tokens

vLLM runs with rollout.enforce_eager = true (no torch.compile: a faster start on CPU). Printed per
run: median step time after --warmup steps, the trainer's and the rollout rank's idle shares
(async/idle_*), mean staleness, the share of rows with tokens of two versions, the engine's
log-prob distance to its rank's float32 copy after the pushes (rollout/engine_diff_max, vLLM only),
generated tokens per step, and the foreign CPU load (this machine is shared: read the times with it).
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
REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from offpolicy_bench import make_project  # noqa: E402
from proctree import TreeSampler, idle_probe  # noqa: E402

SPLIT = ["resources.workers=1", "resources.rollout_workers=1"]
ASYNC = ["rollout.mode=async", "rollout.max_staleness=2", "rollout.staleness_strategy=wait",
         "actor.policy_loss=decoupled_ppo"]
MODES = {"one_step_off": ["rollout.mode=one_step_off"], "async K=2": ASYNC,
         "async K=2 partial": ASYNC + ["rollout.partial_rollout=true"]}
ENGINES = {"hf": ["rollout.engine=hf"], "vllm": ["rollout.engine=vllm", "rollout.enforce_eager=true"]}


def run(project: Path, engine: str, mode: str, a) -> dict:
    from rlctl.config.loader import load_config
    from rlctl.controller.run import start_training

    name = f"bench-{engine}-{mode.replace(' ', '-').replace('=', '')}"
    overrides = SPLIT + MODES[mode] + ENGINES[engine] + [
        f"run.name={name}", f"run.total_steps={a.steps}", "run.save_every=0", "data.val_files=[]",
        "resources.gpus_per_node=0", "resources.cpus_per_worker=1", f"data.batch_size={a.batch_size}",
        f"rollout.n={a.n}", f"data.max_response_length={a.max_response_length}", f"rollout.partial_chunk={a.chunk}",
        f"actor.mini_batch_size={a.batch_size}", f"actor.micro_batch_size={a.batch_size * a.n // 2}",
        "run.seed=0", "actor.lr=1e-7"]
    t0 = time.perf_counter()
    with TreeSampler(os.getpid()) as sampler:
        start_training(load_config(project / "rlctl.toml", overrides), address=None, force=True)
        t1 = time.perf_counter()
    rows = [json.loads(line) for line in (project / "runs" / name / "metrics.jsonl").read_text().splitlines()]
    measured = rows[a.warmup:]
    span = sum(r["timing/step_s"] for r in measured)

    def mean(key: str) -> float | None:   # None: not logged in this mode (one_step_off has no async/*)
        values = [r[key] for r in measured if key in r]
        return statistics.mean(values) if values else None

    return {"engine": engine, "mode": mode, "step_s": statistics.median(r["timing/step_s"] for r in measured),
            "idle_trainer": mean("async/idle_trainer"), "idle_rollout": mean("async/idle_rollout"),
            "staleness": statistics.mean(r.get("async/staleness_mean", r.get("rollout/staleness", 0.0))
                                         for r in measured),
            "partial_ratio": mean("async/partial_ratio"),
            "engine_diff_max": max((r.get("rollout/engine_diff_max", 0.0) for r in rows), default=0.0),
            "gen_tokens": statistics.mean(r["response_length/mean"] * r["data/sequences"] for r in measured),
            "foreign_cores": sampler.foreign_cores(t1 - span, t1), "wall_s": t1 - t0}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-response-length", type=int, default=32)
    p.add_argument("--chunk", type=int, default=8, help="rollout.partial_chunk")
    p.add_argument("--engines", default="hf,vllm")
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument("--json", default="")
    a = p.parse_args()
    print(f"foreign CPU load before: {max(0.0, idle_probe(2.0)):.2f} cores busy (this process idle)", flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="rlctl-async-vllm-bench-") as tmp:
        project = make_project(Path(tmp), a)
        for engine in filter(None, a.engines.split(",")):
            for mode in filter(None, a.modes.split(",")):
                results.append(run(project, engine, mode, a))
                print(f"{engine} {mode}: done in {results[-1]['wall_s']:.0f} s", flush=True)
    print(f"\n{a.batch_size} prompts x {a.n} samples, <= {a.max_response_length} new tokens, {a.layers} layers x "
          f"hidden {a.hidden}, 1 actor + 1 rollout core; median of steps {a.warmup + 1}..{a.steps} at lr 1e-7")
    print("| engine | mode | step s | trainer idle | rollout idle | staleness | partial rows | engine diff max | "
          "gen tokens/step | run wall s | foreign cores |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    share = lambda x: "—" if x is None else f"{x:.0%}"   # noqa: E731
    for r in results:
        diff = f"{r['engine_diff_max']:.1e}" if r["engine"] != "hf" else "—"
        print(f"| {r['engine']} | {r['mode']} | {r['step_s']:.2f} | {share(r['idle_trainer'])} | "
              f"{share(r['idle_rollout'])} | {r['staleness']:.2f} | {share(r['partial_ratio'])} | {diff} | "
              f"{r['gen_tokens']:.0f} | {r['wall_s']:.0f} | {r['foreign_cores']:.2f} |")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
