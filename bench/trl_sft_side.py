"""TRL's SFTTrainer on rlctl's SFT data: the TRL side of bench/sft_trl_e2e_bench.py (runs in a TRL venv).

Reads a parquet written by `rlctl data prep arith --sft` (a chat `prompt` column and a
`response` string), turns each row into TRL's conversational prompt-completion form, and trains
with completion-only loss (TRL's default for prompt-completion data), no packing, fp32 on CPU,
full batches only. TRL's completion is everything after the generation prompt, so it also trains
the newline the template puts after `<|im_end|>` (one token more per row than rlctl's mask).
Timing comes from a TrainerCallback: step_s = on_step_begin -> on_step_end; tokens per step are
the non-padding tokens of the batch the collator built (what rlctl logs as train/tokens).
Prints one `trl_sft ...` summary line and, with --json, writes every measured step.

    /tmp/venv-trl/bin/python bench/trl_sft_side.py --model M --data D/train.parquet --steps 60 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from proctree import machine_busy_s   # bench/ (the script's folder) is on sys.path; stdlib only


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True, help="train parquet with prompt + response columns")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup-steps", type=int, default=2, help="steps left out of the timing")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--lr-warmup", type=int, default=10)
    ap.add_argument("--min-lr-ratio", type=float, default=0.1)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", default="")
    a = ap.parse_args()

    import torch
    torch.set_num_threads(a.threads)
    import pyarrow.parquet as pq
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    rows = pq.read_table(a.data, columns=["prompt", "response"]).to_pylist()
    data = Dataset.from_list([{"prompt": r["prompt"], "completion": [{"role": "assistant", "content": r["response"]}]}
                              for r in rows])
    tokenizer = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    config = SFTConfig(
        output_dir="/tmp/trl-sft-bench-out", max_steps=a.steps, per_device_train_batch_size=a.batch,
        gradient_accumulation_steps=1, learning_rate=a.lr, warmup_steps=a.lr_warmup,
        lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr_rate": a.min_lr_ratio},
        weight_decay=0.0, max_grad_norm=1.0, max_length=a.max_length, packing=False,
        completion_only_loss=True, bf16=False, fp16=False, use_cpu=True, gradient_checkpointing=False,
        logging_steps=1, disable_tqdm=True, save_strategy="no", report_to="none", seed=a.seed, dataloader_num_workers=0,
        dataloader_drop_last=True,   # full batches only, as rlctl (360 rows = 11 steps of 32 per epoch)
        dataset_num_proc=1)

    steps: list[dict] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()
            self.busy0, self.own0 = machine_busy_s(), _own_cpu_s()

        def on_step_end(self, args, state, control, **kw):
            wall = time.perf_counter() - self.t0
            foreign = (machine_busy_s() - self.busy0 - (_own_cpu_s() - self.own0)) / max(wall, 1e-9)
            steps.append({"step": state.global_step, "step_s": wall, "foreign_cores": max(0.0, foreign)})

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "loss" in logs and steps:
                steps[-1]["loss"] = float(logs["loss"])

    trainer = SFTTrainer(model=model, args=config, train_dataset=data, processing_class=tokenizer,
                         callbacks=[Timer()])
    collate = trainer.data_collator
    tokens: list[tuple[int, int]] = []

    def counting_collator(features):
        batch = collate(features)
        mask = batch.get("attention_mask")
        n = int(mask.sum()) if mask is not None else int(batch["input_ids"].numel())
        tokens.append((n, int((batch["labels"] != -100).sum())))
        return batch

    trainer.data_collator = counting_collator
    trainer.train()

    for s, (n, n_loss) in zip(steps, tokens):
        s["tokens"], s["loss_tokens"] = n, n_loss
        s["tokens_per_s"] = n / s["step_s"]
    measured = steps[a.warmup_steps:]
    step_s = statistics.median(s["step_s"] for s in measured)
    tok_s = sum(s["tokens"] for s in measured) / sum(s["step_s"] for s in measured)
    foreign = statistics.mean(s["foreign_cores"] for s in measured)
    final_loss = next(s["loss"] for s in reversed(steps) if "loss" in s)
    summary = {"tool": "trl", "steps": a.steps, "batch": a.batch, "threads": a.threads, "step_s": step_s,
               "tokens_per_s": tok_s, "tokens_per_step": statistics.mean(s["tokens"] for s in measured),
               "loss_tokens_per_step": statistics.mean(s["loss_tokens"] for s in measured),
               "final_loss": final_loss, "foreign_cores": foreign,
               "versions": {"trl": trl.__version__, "transformers": transformers.__version__,
                            "torch": torch.__version__}}
    print(f"trl_sft step_s={step_s:.4f} tokens_per_s={tok_s:.0f} tokens_per_step={summary['tokens_per_step']:.0f} "
          f"loss_tokens_per_step={summary['loss_tokens_per_step']:.0f} final_loss={final_loss:.4f} "
          f"foreign_cores={foreign:.2f} threads={a.threads} trl={trl.__version__}", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"summary": summary, "steps": steps}, f, indent=1)


if __name__ == "__main__":
    main()
