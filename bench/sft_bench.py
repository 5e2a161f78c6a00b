#!/usr/bin/env python3
"""SFT step speed: padded micro-batches against length-grouped token-budget ones, same batches.

  .venv/bin/python bench/sft_bench.py [--layers 4 --hidden 256] [--batch 16] [--steps 5] [--threads 2]

Data: GSM8K SFT rows (question + worked solution, chat template of rlctl's tiny byte-level model,
so ~300-1100 tokens each: lengths vary ~4x), from ../shared/data/gsm8k when present, else the
repository's 48-row sample. Each mode trains a fresh copy of the same tiny model on the same
batches with the real SFTWorker (one rank, in-process, fp32):
  padded   one micro-batch of --batch rows, padded to the longest (what a plain trainer does)
  rows4    4 rows per micro-batch after sorting by length
  budget   sft.micro_batch_max_tokens = --budget (rows x longest row per micro-batch)
Prints the median step time, real tokens/s, the share of padding the model ran on, and the
first step's loss (identical across modes up to float rounding: the loss is normalised by the
batch's target tokens, not per micro-batch). Median of --steps after one warm-up step;
`foreign` = cores used by other processes meanwhile (from /proc/stat).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RLCTL_SHARED", REPO.parent / "shared"))
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from proctree import machine_busy_s  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--budget", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from rlctl.config.schema import Config
    from rlctl.tasks.prep import PrepOptions, prepare
    from rlctl.data.sft import build_samples, collate
    from rlctl.models.tiny import build_tiny_model
    from rlctl.models.loading import load_tokenizer
    from rlctl.workers.roles.sft import SFTWorker

    tmp = Path(tempfile.mkdtemp(prefix="sft-bench-"))
    full = SHARED / "data" / "gsm8k"
    source = full if (full / "train.jsonl").is_file() else REPO / "tests" / "fixtures" / "gsm8k"
    prepare("gsm8k", PrepOptions(source=str(source), out=tmp / "data", sft=True, splits=("train",)))
    model = tmp / "model"
    build_tiny_model(model, layers=args.layers, hidden=args.hidden, heads=4, kv_heads=2, seed=0)
    c = Config()
    sft = dataclasses.replace(c.sft, max_length=2048, truncation="right")
    samples = build_samples([tmp / "data" / "train.parquet"], load_tokenizer(str(model)), sft).samples
    steps = args.steps + 1
    if len(samples) < steps * args.batch:
        raise SystemExit(f"{len(samples)} samples are too few for {steps} steps of {args.batch}; set RLCTL_SHARED "
                         "to the folder holding data/gsm8k, or lower --steps / --batch")
    batches = [collate(samples[i * args.batch:(i + 1) * args.batch], 0) for i in range(steps)]
    modes = {"padded": dict(micro_batch_max_tokens=0, rows=args.batch), "rows4": dict(micro_batch_max_tokens=0, rows=4),
             "budget": dict(micro_batch_max_tokens=args.budget, rows=args.batch)}
    print(f"model {args.layers}x{args.hidden}, {len(samples)} GSM8K SFT samples ({source}), batch {args.batch}, "
          f"threads {args.threads}, median of {args.steps} steps after 1 warm-up")
    print(f"{'mode':8} {'step_s':>8} {'real tok/s':>11} {'padding':>8} {'micro/step':>10} {'loss step 1':>12} {'foreign':>8}")
    for name, mode in modes.items():
        cfg = dataclasses.replace(
            c, model=dataclasses.replace(c.model, path=str(model), dtype="float32"),
            actor=dataclasses.replace(c.actor, lr=1e-4, micro_batch_size=mode["rows"]),
            sft=dataclasses.replace(sft, micro_batch_max_tokens=mode["micro_batch_max_tokens"]),
            run=dataclasses.replace(c.run, kind="sft"))
        worker = SFTWorker(cfg, total_steps=steps)
        times, rates, ran, real, micros, first = [], [], 0, 0, 0, None
        busy0, wall0, own0 = machine_busy_s(), time.perf_counter(), time.process_time()
        for i, batch in enumerate(batches):
            parts = worker._micro_batches(batch)
            start = time.perf_counter()
            out = worker.train_step(batch)
            elapsed = time.perf_counter() - start
            first = out["train/loss"] if first is None else first
            if i:   # the first step warms up
                tokens = float(batch["attention_mask"].sum())
                times.append(elapsed)
                rates.append(tokens / elapsed)
                ran += sum(int(p["attention_mask"].numel()) for p in parts)
                real += int(tokens)
                micros += len(parts)
        wall = time.perf_counter() - wall0
        foreign = max(0.0, (machine_busy_s() - busy0) - (time.process_time() - own0)) / wall
        print(f"{name:8} {statistics.median(times):8.2f} {statistics.median(rates):11.0f} {1 - real / ran:8.1%} "
              f"{micros / args.steps:10.1f} {first:12.6f} {foreign:8.2f}")


if __name__ == "__main__":
    main()
