"""Benchmark (not a test): the controller's share of a GRPO step on the shared bench workload.

    .venv/bin/python tests/runtime/bench_controller_overhead.py [--workers 1 --cpus 2 --steps 5]

Workload of ../shared/bench/workload.py: the `tiny` bench model (4 layers, hidden 256, built here
offline), 4 prompts x 8 samples, 64 new tokens, KL loss to a frozen reference, lr 1e-6.
Per step: generate -> ref log-probs -> GRPO advantages (controller) -> update_actor (on-policy,
so no old log-prob pass, like TRL). Overhead = wall time of the worker calls minus the time the
slowest rank spent inside the methods (splitting, serialisation, object store, scheduling),
as a share of the step's wall time; the controller's own numpy/torch work is reported apart.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

SHARED = Path(os.environ.get("RLCTL_SHARED", Path(__file__).resolve().parents[2].parent / "shared"))


def prompts(tokenizer, step: int):
    sys.path.insert(0, str(SHARED / "bench"))
    import workload as W

    rows = W.make_rows()[step * W.PROMPTS_PER_STEP:(step + 1) * W.PROMPTS_PER_STEP]
    ids = [tokenizer.apply_chat_template(r["prompt"], tokenize=True, add_generation_prompt=True,
                                         return_dict=True)["input_ids"] for r in rows]
    width = max(len(i) for i in ids)
    input_ids = np.full((len(ids), width), tokenizer.pad_token_id, dtype=np.int64)
    mask = np.zeros_like(input_ids)
    for r, row in enumerate(ids):
        input_ids[r, width - len(row):], mask[r, width - len(row):] = row, 1
    return input_ids, mask


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--cpus", type=int, default=2, help="cpus_per_worker (torch threads)")
    ap.add_argument("--steps", type=int, default=5)
    a = ap.parse_args()

    import torch

    from rlctl import algorithms as A
    from rlctl.config import schema
    from rlctl.models.tiny import build_tiny_model
    from rlctl.runtime import Batch
    from rlctl.runtime.ray_env import ray_session
    from rlctl.workers.roles.groups import start_workers
    from rlctl.models.loading import load_tokenizer

    model = Path(tempfile.mkdtemp()) / "tiny"
    build_tiny_model(model, layers=4, hidden=256, heads=4, kv_heads=2, intermediate=1024, seed=0)
    cfg = schema.Config(
        model=schema.ModelConfig(path=str(model)),
        data=schema.DataConfig(batch_size=4, max_response_length=64),
        actor=schema.ActorConfig(lr=1e-6, micro_batch_size=32 // a.workers, use_kl_loss=True, kl_loss_coef=0.04,
                                 kl_loss_type="k3", loss_agg_mode="token-mean"),
        rollout=schema.RolloutConfig(n=8, temperature=1.0),
        resources=schema.ResourcesConfig(workers=a.workers, cpus_per_worker=a.cpus))
    tok = load_tokenizer(str(model))
    torch.set_num_threads(1)
    with ray_session(num_cpus=max(os.cpu_count() or 1, a.workers * a.cpus)):
        workers = start_workers(cfg, total_steps=a.steps + 1, needs=A.algorithm_needs("grpo", use_kl_loss=True))
        group = workers.groups[0]
        rows = []
        for step in range(a.steps + 1):
            group.timing.clear()
            start = time.perf_counter()
            ids, mask = prompts(tok, step)
            batch = workers.actor.generate(Batch({"input_ids": ids, "attention_mask": mask}), seed=step)
            batch = batch.union(workers.actor.compute_ref_log_prob(batch))
            t0 = time.perf_counter()
            scores = torch.from_numpy(np.random.default_rng(step).random(len(batch)).astype(np.float32))
            mask_t = torch.from_numpy(batch["response_mask"])
            rewards = torch.zeros_like(mask_t)
            rewards[torch.arange(len(batch)), torch.from_numpy(batch["response_length"]) - 1] = scores
            adv, _ = A.compute_advantages("grpo", token_level_rewards=rewards, response_mask=mask_t,
                                          group_ids=np.repeat(np.arange(4), 8))
            batch["advantages"] = adv.numpy()
            controller_s = time.perf_counter() - t0
            metrics = workers.actor.update_actor(batch)
            step_s = time.perf_counter() - start
            wall = sum(t["wall_s"] for t in group.timing.values())
            worker = sum(t["worker_s"] for t in group.timing.values())
            rows.append({"step": step, "step_s": step_s, "calls_wall_s": wall, "worker_s": worker,
                         "overhead_s": wall - worker, "overhead_share": (wall - worker) / step_s,
                         "controller_compute_s": controller_s, "tokens": int(batch["response_length"].sum()),
                         "per_call": {k: round(v["wall_s"] - v["worker_s"], 4) for k, v in group.timing.items()},
                         "pg_loss": metrics["actor/pg_loss"]})
            print(json.dumps(rows[-1]), flush=True)
    measured = rows[1:]
    share = float(np.median([r["overhead_share"] for r in measured]))
    print(f"controller overhead: median {100 * share:.2f}% of step wall time "
          f"(median step {np.median([r['step_s'] for r in measured]):.2f} s, "
          f"overhead {np.median([r['overhead_s'] for r in measured]) * 1000:.1f} ms/step; "
          f"workers={a.workers} cpus_per_worker={a.cpus})")


if __name__ == "__main__":
    main()
