#!/usr/bin/env python3
"""Log-prob parity of a bf16 run's frozen reference: the reference as rlctl holds it against a float32
one and against a pure-bf16 one (every weight bf16, no autocast), on one step of the shared workload.

  .venv/bin/python bench/ref_parity.py --model-dir DIR [--max-new 64] [--batch /tmp/parity-batch.npz]

The actor worker (one rank, no Ray) of a `model.dtype = "bfloat16"` run generates 4 prompts x 8 of
../shared/bench's workload (T = 1); then on those rows: the policy's log-probs (`compute_log_prob`: float32
masters under bf16 autocast), the worker's reference (`compute_ref_log_prob`), a float32 reference and a
pure-bf16 one. Prints, per pair, the max and mean absolute difference of the response tokens' log-probs
and, against the policy (the same weights at step 0), the KL metric the update logs (`actor/kl`, mean
log pi - log pi_ref) and the k3 estimate the KL loss uses. --batch keeps the generated rows for a rerun.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
SHARED_BENCH = Path(os.environ.get("RLCTL_SHARED", REPO.parent / "shared")) / "bench"
sys.path[:0] = [str(REPO), str(SHARED_BENCH)]


def generated_rows(worker, max_new: int, cache: str):
    """One generate of the workload's first 4 prompts x 8 (kept in `cache` when given)."""
    import numpy as np

    import workload as W  # ../shared/bench/workload.py
    from rlctl.controller.prompts import render_prompts
    from rlctl.controller.rollout import prompt_batch
    from rlctl.runtime import Batch

    keys = ("input_ids", "attention_mask", "response_mask")
    if cache and Path(cache).exists():
        saved = np.load(cache)
        return Batch({k: saved[k] for k in keys})
    rows = [{"prompt": r["prompt"], "data_source": "bench", "reward_model": {"ground_truth": str(r["answer"])},
             "extra_info": {}} for r in W.make_rows()[:W.PROMPTS_PER_STEP]]
    prompts = render_prompts(rows, worker.tokenizer, W.MAX_PROMPT_LENGTH, "error").rows
    gen = worker.generate(prompt_batch(prompts, "bench", worker.tokenizer.pad_token_id), seed=0)
    if cache:
        np.savez(cache, **{k: gen[k] for k in keys})
    return Batch({k: gen[k] for k in keys})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--max-new", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", default="", help="an .npz to keep the generated rows in (reused when present)")
    a = ap.parse_args()

    import numpy as np
    import torch

    import workload as W
    from rlctl.config.schema import ActorConfig, Config, DataConfig, ModelConfig, RolloutConfig
    from rlctl.workers.compute.engine import TrainEngine
    from rlctl.workers.compute.models import load_causal_lm
    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    torch.set_num_threads(a.threads)
    config = Config(model=ModelConfig(path=a.model_dir, dtype="bfloat16"),
                    data=DataConfig(train_files=("x",), max_prompt_length=W.MAX_PROMPT_LENGTH,
                                    max_response_length=a.max_new),
                    rollout=RolloutConfig(n=W.NUM_GENERATIONS, temperature=1.0, top_p=1.0, top_k=0),
                    actor=ActorConfig(micro_batch_size=32, use_kl_loss=True))
    worker = ActorRolloutRefWorker(config)
    batch = generated_rows(worker, a.max_new, a.batch)
    mask = batch["response_mask"].astype(bool)
    held = sum(p.numel() * p.element_size() for p in worker.ref.module.parameters()) / 2 ** 20
    lp = {"policy": worker.compute_log_prob(batch)["old_log_prob"],
          "reference as held": worker.compute_ref_log_prob(batch)["ref_log_prob"]}
    worker.ref = TrainEngine(load_causal_lm(config.model), None, compute_dtype=torch.float32)
    lp["float32 reference"] = worker.compute_ref_log_prob(batch)["ref_log_prob"]
    worker.ref.module.to(torch.bfloat16)   # every weight bf16, run without autocast (compute_dtype float32)
    lp["pure-bf16 reference"] = worker.compute_ref_log_prob(batch)["ref_log_prob"]
    print(f"{int(mask.sum())} response tokens in {mask.shape[0]} rows (<= {a.max_new} new); reference held in "
          f"{held:.1f} MiB")
    for a_name, b_name in [("reference as held", "float32 reference"), ("pure-bf16 reference", "float32 reference"),
                           ("policy", "float32 reference"), ("policy", "reference as held"),
                           ("policy", "pure-bf16 reference")]:
        d = (lp[a_name] - lp[b_name])[mask]
        kl = f"  kl {d.mean():+.5f}  k3 {(np.exp(-d) - 1 + d).mean():.6f}" if a_name == "policy" else ""
        print(f"{a_name:>20} vs {b_name:<20} max|d| {np.abs(d).max():.4f}  mean|d| {np.abs(d).mean():.5f}{kl}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
