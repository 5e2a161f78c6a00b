"""TRL's GRPOTrainer on the `grpo-arith-smollm2-cpu` recipe's workload, for learning per step beside rlctl.

Run by a venv that has trl (see ../shared/bench/BASELINE.md), on the arith parquet `rlctl data prep arith`
wrote and the model folder `rlctl model get smollm2-135m-instruct` wrote:

    /tmp/venv-trl/bin/python bench/trl_arith_learning.py --data DIR/data/arith/train.parquet \
        --model-dir DIR/models/smollm2 --seed 0 --steps 12 --bf16 --threads 2 --json out.json

The recipe's settings on TRL's side: 8 prompts x 8 samples a step, <= 16 new tokens, temperature 1,
lr 2e-5 without warm-up or weight decay, no KL (beta 0), token-mean loss (loss_type "dapo"), rewards
normalised by the group's std, one optimizer step per batch; the reward is rlctl's `arith_answer`
(imported from this checkout: TRL and rlctl score with the same function). Prints and writes the mean
reward of each step; bench/arith_learning.py runs both tools over seeds and prints them side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # this checkout's rlctl

PROMPTS, SAMPLES, MAX_NEW, LR = 8, 8, 16, 2e-5


def arith_answer(completions, ground_truth, **_):
    """rlctl's arith_answer on each completion's text (TRL passes the dataset's columns by name)."""
    from rlctl.tasks.arith import score_answer

    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [score_answer(text, truth)["score"] for text, truth in zip(texts, ground_truth)]


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="data/arith/train.parquet from `rlctl data prep arith`")
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast (GRPOConfig bf16=True)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--out-dir", default="/tmp/trl-arith-out")
    a = ap.parse_args(argv)

    import datasets
    import torch
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.set_num_threads(a.threads)
    rows = datasets.Dataset.from_parquet(a.data)
    ds = rows.map(lambda r: {"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"]},
                  remove_columns=[c for c in rows.column_names if c != "prompt"])
    args = GRPOConfig(output_dir=a.out_dir, per_device_train_batch_size=PROMPTS * SAMPLES, num_generations=SAMPLES,
                      max_completion_length=MAX_NEW, num_iterations=1, beta=0.0, learning_rate=LR,
                      lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, loss_type="dapo",
                      temperature=1.0, top_p=1.0, max_steps=a.steps, bf16=a.bf16, use_cpu=True,
                      gradient_checkpointing=False, report_to="none", logging_steps=1, save_strategy="no",
                      disable_tqdm=True, seed=a.seed, data_seed=a.seed, model_init_kwargs={"dtype": "float32"})
    steps: list[dict] = []

    class Log(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "reward" in logs:
                seconds = time.perf_counter() - self.t0
                steps.append({"step": len(steps) + 1, "reward": logs["reward"], "step_s": seconds})
                print(f"step {len(steps)}  reward {logs['reward']:.3f}  step_s {steps[-1]['step_s']:.1f}", flush=True)

    GRPOTrainer(model=a.model_dir, reward_funcs=[arith_answer], args=args, train_dataset=ds,
                callbacks=[Log()]).train()
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"tool": "trl", "seed": a.seed, "bf16": a.bf16, "steps": steps}, f)


if __name__ == "__main__":
    main()
