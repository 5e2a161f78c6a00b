#!/usr/bin/env python3
"""One SFT step, rlctl against TRL's SFTTrainer: same model, same examples, same batch, same threads.

  .venv/bin/python bench/sft_trl_bench.py --trl-python /tmp/venv-trl/bin/python [--steps 8] [--threads 2]

Workload: the offline `arith` SFT data (`rlctl data prep arith --sft`: chat prompt + the sum as the
assistant's reply, ~60 tokens each with the byte-level tokenizer), 32 examples per optimizer step,
loss on the reply only (rlctl `assistant_only_loss`; TRL's prompt-completion format, whose
`completion_only_loss` is on by default), AdamW lr 3e-3, no weight decay, grad clip 1.0, fp32, no
gradient checkpointing, no packing; model: rlctl's tiny Qwen2 (--layers x --hidden, seed 0).
rlctl: the SFTWorker's `train_step` (the code every rank of `rlctl train` runs), one rank,
in-process; TRL: `SFTTrainer.train()` timed per optimizer step with a callback (its dataloader and
collator included). Median of --steps after 2 warm-up steps; real tokens/s = the batch's tokens
(without padding) / step time, tokens counted once with the chat template for both. The TRL venv:
see ../shared/bench/BASELINE.md (pip install torch==2.13.0, then trl transformers peft datasets accelerate).
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
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
BATCH, LR, MAX_LENGTH, WARMUP = 32, 3e-3, 128, 2


def run_trl(model: str, data: str, steps: int, threads: int) -> dict:
    """Inside the TRL venv: SFTTrainer on the jsonl rows {prompt: [...], completion: [...]}."""
    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    torch.set_num_threads(threads)
    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            self.start = time.perf_counter()

        def on_step_end(self, *a, **k):
            times.append(time.perf_counter() - self.start)

    args = SFTConfig(output_dir=tempfile.mkdtemp(), per_device_train_batch_size=BATCH, gradient_accumulation_steps=1,
                     learning_rate=LR, weight_decay=0.0, max_grad_norm=1.0, lr_scheduler_type="constant",
                     warmup_steps=0, max_steps=steps + WARMUP, use_cpu=True, bf16=False, fp16=False,
                     gradient_checkpointing=False, packing=False, max_length=MAX_LENGTH, logging_steps=1,
                     save_strategy="no", report_to="none", seed=0, dataloader_num_workers=0)
    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32), args=args,
                         train_dataset=load_dataset("json", data_files=data, split="train"),
                         processing_class=AutoTokenizer.from_pretrained(model), callbacks=[Clock()])
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return {"step_s": times[WARMUP:], "first_loss": losses[0] if losses else None}


def run_rlctl(model: Path, samples, steps: int, threads: int) -> dict:
    import dataclasses

    import torch

    from rlctl.config.schema import Config
    from rlctl.data.sft import collate
    from rlctl.workers.roles.sft import SFTWorker

    torch.set_num_threads(threads)
    c = Config()
    cfg = dataclasses.replace(c, run=dataclasses.replace(c.run, kind="sft"),
                              model=dataclasses.replace(c.model, path=str(model), dtype="float32"),
                              actor=dataclasses.replace(c.actor, lr=LR, weight_decay=0.0, grad_clip=1.0,
                                                        micro_batch_size=BATCH),
                              sft=dataclasses.replace(c.sft, max_length=MAX_LENGTH))
    worker = SFTWorker(cfg, total_steps=steps + WARMUP)
    times, first = [], None
    for i in range(steps + WARMUP):
        batch = collate(samples[i * BATCH:(i + 1) * BATCH], 0)
        start = time.perf_counter()
        out = worker.train_step(batch)
        times.append(time.perf_counter() - start)
        first = out["train/loss"] if first is None else first
    return {"step_s": times[WARMUP:], "first_loss": first}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trl-python", default="/tmp/venv-trl/bin/python")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--trl-worker", nargs=2, metavar=("MODEL", "DATA"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.trl_worker:
        print(json.dumps(run_trl(*args.trl_worker, args.steps, args.threads)))
        return

    sys.path.insert(0, str(REPO))
    import pyarrow.parquet as pq

    from rlctl.tasks.prep import PrepOptions, prepare
    from rlctl.data.sft import build_samples
    from rlctl.config.schema import SFTConfig
    from rlctl.models.tiny import build_tiny_model
    from rlctl.models.loading import load_tokenizer

    tmp = Path(tempfile.mkdtemp(prefix="sft-trl-bench-"))
    prepare("arith", PrepOptions(out=tmp / "data", sft=True))
    model = tmp / "model"
    build_tiny_model(model, layers=args.layers, hidden=args.hidden, heads=4, kv_heads=2, seed=0)
    rows = pq.read_table(tmp / "data" / "train.parquet").to_pylist()
    with open(tmp / "trl.jsonl", "w") as f:   # TRL's conversational prompt-completion rows, same order
        for row in rows:
            f.write(json.dumps({"prompt": row["prompt"], "completion": [{"role": "assistant",
                                                                         "content": row["response"]}]}) + "\n")
    samples = build_samples([tmp / "data" / "train.parquet"], load_tokenizer(str(model)), SFTConfig()).samples
    tokens = sum(len(s.input_ids) for s in samples) / len(samples) * BATCH   # real tokens per step
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": ""}
    proc = subprocess.run([args.trl_python, __file__, "--trl-worker", str(model), str(tmp / "trl.jsonl"),
                           "--steps", str(args.steps), "--threads", str(args.threads)],
                          capture_output=True, text=True, env=env)
    if proc.returncode:
        raise SystemExit(f"TRL run failed:\n{proc.stderr[-3000:]}")
    trl = json.loads(proc.stdout.strip().splitlines()[-1])
    ours = run_rlctl(model, samples, args.steps, args.threads)
    print(f"model {args.layers}x{args.hidden}, arith SFT, {BATCH} examples/step (~{tokens:.0f} real tokens), "
          f"threads {args.threads}, median of {args.steps} steps after {WARMUP} warm-up")
    print(f"{'tool':6} {'step_s':>8} {'[min-max]':>15} {'real tok/s':>11} {'loss step 1':>12}")
    for name, r in (("TRL", trl), ("rlctl", ours)):
        med = statistics.median(r["step_s"])
        print(f"{name:6} {med:8.3f} [{min(r['step_s']):.3f}-{max(r['step_s']):.3f}] {tokens / med:11.0f} "
              f"{r['first_loss'] if r['first_loss'] is not None else float('nan'):12.4f}")


if __name__ == "__main__":
    main()
