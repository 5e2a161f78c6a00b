#!/usr/bin/env python3
"""Does multi-turn GRPO still learn tool use when its rollouts are asynchronous?

  .venv/bin/python bench/async_tool_learning.py [--steps 24] [--modes sync,one_step_off,async2,...] [--seed 42]
                                                [--out DIR]

The setting of tests/multiturn/test_tool_learning.py: the shipped `grpo-calc-tools-cpu` recipe from
tests/fixtures/calc-tools-sft (the SFT stage's model), eight fixed training prompts, the real
calculator, real Ray actors on CPU. Every mode runs one actor worker (async and one_step_off add
one rollout worker); `async2` is rollout.mode = "async", max_staleness = 2, "wait", decoupled_ppo;
`async2_ppo` the same with the recipe's loss (vanilla PPO, rollout correction's sequence-level TIS);
`async1` max_staleness = 1 (one_step_off's run, bit for bit); `async2_ppo_token_is` /
`async2_ppo_no_is` the recipe's loss with token-level or no rollout correction; `async2_uncapped`
decoupled_ppo without its behaviour-weight cap (rollout_is_threshold = 1e9); `async2_ppo_partial`
async2_ppo with partial rollouts (a push may land between two turns of a conversation).
Prints tool use (multi_turn/tool_use_frac) and sampled accuracy (reward/acc), means of the first
and last 4 steps, the mean staleness, the mean share of rows with tokens of two versions
(async/partial_ratio) and the wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests")]

FIXTURE = REPO / "tests" / "fixtures" / "calc-tools-sft"
MODES = {
    "sync": [],
    "one_step_off": ["rollout.mode=one_step_off", "resources.rollout_workers=1"],
    "async2": ["rollout.mode=async", "resources.rollout_workers=1", "rollout.max_staleness=2",
               "rollout.staleness_strategy=wait", "actor.policy_loss=decoupled_ppo"],
    "async2_uncapped": ["rollout.mode=async", "resources.rollout_workers=1", "rollout.max_staleness=2",
                        "rollout.staleness_strategy=wait", "actor.policy_loss=decoupled_ppo",
                        "algorithm.rollout_correction.rollout_is_threshold=1e9"],
    "async1": ["rollout.mode=async", "resources.rollout_workers=1", "rollout.max_staleness=1",
               "rollout.staleness_strategy=wait"],
    "async2_ppo": ["rollout.mode=async", "resources.rollout_workers=1", "rollout.max_staleness=2",
                   "rollout.staleness_strategy=wait"],
    "async2_ppo_no_is": ["rollout.mode=async", "resources.rollout_workers=1", "rollout.max_staleness=2",
                         "rollout.staleness_strategy=wait", "algorithm.rollout_correction.rollout_is="],
    "async2_ppo_partial": ["rollout.mode=async", "resources.rollout_workers=1", "rollout.max_staleness=2",
                           "rollout.staleness_strategy=wait", "rollout.partial_rollout=true"],
    "async2_ppo_token_is": ["rollout.mode=async", "resources.rollout_workers=1", "rollout.max_staleness=2",
                            "rollout.staleness_strategy=wait", "algorithm.rollout_correction.rollout_is=token"],
}


def run(mode: str, steps: int, folder: Path, seed: int) -> dict:
    from rlctl.config.loader import load_config
    from rlctl.controller.run import start_training
    from rlctl.project import write_project
    from rlctl.tasks.calc_tools import generate
    from support.parquet_rows import write_rows

    write_project(folder, "grpo-calc-tools-cpu", str(FIXTURE))
    rows = [{key: row[key] for key in ("data_source", "prompt", "reward_model", "extra_info")}
            for row in generate(0)["train"][:8]]
    write_rows(folder / "data" / "calc-tools" / "train.parquet", rows)
    start = time.perf_counter()
    start_training(load_config(folder / "rlctl.toml", [
        f"run.total_steps={steps}", "run.save_every=0", "run.val_every=0", "run.val_before_train=false",
        "data.val_files=[]", "data.batch_size=8", "resources.workers=1", "run.loggers=[\"jsonl\"]",
        f"run.seed={seed}",
        *MODES[mode]]), address=None, force=False)
    wall = time.perf_counter() - start
    metrics = [json.loads(line) for line in (folder / "runs" / "grpo-calc-tools-cpu" / "metrics.jsonl")
               .read_text().splitlines()]

    def mean(key, part):
        return sum(m[key] for m in part) / len(part)

    return {"tool use": (mean("multi_turn/tool_use_frac", metrics[:4]), mean("multi_turn/tool_use_frac", metrics[-4:])),
            "accuracy": (mean("reward/acc", metrics[:4]), mean("reward/acc", metrics[-4:])),
            "staleness": mean("rollout/staleness", metrics) if "rollout/staleness" in metrics[0] else 0.0,
            "partial": mean("async/partial_ratio", metrics) if "async/partial_ratio" in metrics[0] else 0.0,
            "wall": wall}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--seed", type=int, default=42, help="run.seed")
    parser.add_argument("--out", help="keep the projects in this folder (default: a temporary one)")
    args = parser.parse_args()
    print(f"{args.steps} steps, 8 fixed prompts x 8 samples, grpo-calc-tools-cpu from tests/fixtures/calc-tools-sft, "
          f"run.seed {args.seed}")
    print(f"{'mode':<14}{'tool use first->last 4':>24}{'accuracy first->last 4':>24}{'staleness':>11}{'partial':>9}{'wall s':>8}")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = args.out or tmp
        for mode in args.modes.split(","):
            r = run(mode, args.steps, Path(tmp) / mode, args.seed)
            tool, acc = r["tool use"], r["accuracy"]
            print(f"{mode:<14}{f'{tool[0]:.2f} -> {tool[1]:.2f}':>24}{f'{acc[0]:.2f} -> {acc[1]:.2f}':>24}"
                  f"{r['staleness']:>11.2f}{r['partial']:>9.2f}{r['wall']:>8.0f}", flush=True)


if __name__ == "__main__":
    main()
