#!/usr/bin/env python3
"""SPIN and SPPO on CPU from the demo's SFT model, through the CLI, with the figures their papers claim.

  .venv/bin/python bench/selfplay_bench.py --sft DIR [--work /tmp/selfplay-bench] [--steps 60] [--seed 42]

--sft: the demo's SFT model (scripts/demo.sh's demo/models/sft: `rlctl model tiny --layers 2
--hidden 128`, 300 steps of recipe sft-arith-cpu on 150 labelled sums).

1. SPIN: recipe spin-arith-cpu as shipped (the 150 SFT sums, one generation per prompt against the
   reference answer, opponent refreshed every 20 steps), --steps steps, merged.
   Figure: the likelihood margin log pi(y_ref) - log pi(y_own) on the 150 training prompts, where
   y_own are the SFT model's own samples (4 per prompt at temperature 1, drawn once, before
   training: the first opponent's generations) -- for the SFT model and for the SPIN model; plus
   held-out exact accuracy (greedy) of both.
2. SPPO: recipe sppo-arith-cpu (rollout.n = 8 samples, Bradley-Terry on the recipe's reward, or on
   the reward.function given in --override) on the 300 sums outside the SFT split's 100 held-out
   ones, --steps steps, merged. Figure: its win rate against the SFT model under that same
   preference model, on 100 training prompts and on the 100 held-out ones: mean over prompts and
   4 x 4 sample pairs (temperature 1) of sigmoid(r_new - r_sft), +- its standard error over the
   prompts (1/2 = no better; with the 0/1 reward it is exactly 1/2 + 0.231 x the accuracy gain);
   plus exact accuracy and the mean reward at temperature 1.

Prints one table. Wall times are of a shared 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
       "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO)}
SAMPLES = 4


def rlctl(*args: str, cwd: Path) -> str:
    done = subprocess.run([sys.executable, "-m", "rlctl", *args], cwd=cwd, env=ENV, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"rlctl {' '.join(args)} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    return done.stdout


def project(work: Path, recipe: str, sft: Path, *prep: str) -> Path:
    folder = work / recipe
    if not folder.exists():
        rlctl("init", str(folder), "--recipe", recipe, cwd=work)
        (folder / "models").mkdir()
        shutil.copytree(sft, folder / "models" / "sft")
        rlctl("data", "prep", "arith", *prep, cwd=folder)
    return folder


def train(folder: Path, recipe: str, steps: int, seed: int, *overrides: str) -> tuple[Path, float]:
    start = time.perf_counter()
    rlctl("train", f"run.total_steps={steps}", f"run.seed={seed}", *overrides, "--force", cwd=folder)
    seconds = time.perf_counter() - start
    out = folder / "models" / "trained"
    shutil.rmtree(out, ignore_errors=True)
    rlctl("merge", f"runs/{recipe}", "--to-hf", str(out), cwd=folder)
    return out, seconds


def generations(model: Path, data: Path, out: Path, *, n: int = 1, temperature: float = 0.0,
                reward: str = "arith", limit: int = 0) -> list[dict]:
    rlctl("eval", str(model), "--data", str(data), "--max-new-tokens", "8", "--n", str(n), "--temperature",
          str(temperature), "--seed", "0", "--reward", reward, "--out", str(out),
          *(["--limit", str(limit)] if limit else []), cwd=model.parent)
    return [json.loads(line) for line in out.read_text().splitlines()]


def accuracy(rows: list[dict]) -> tuple[float, float]:
    return sum(r["correct"] for r in rows) / len(rows), sum(r["score"] for r in rows) / len(rows)


def sequence_log_probs(model_dir: Path, pairs: list[tuple[list, str]]) -> list[float]:
    """log pi(response + end of turn | chat prompt) for each (messages, response), in float64 sums."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for messages, response in pairs:
            prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
            answer = tok(response, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            ids = torch.tensor([prompt + answer])
            logp = torch.log_softmax(model(ids).logits[0, :-1].double(), -1)
            targets = ids[0, 1:]
            out.append(float(logp[torch.arange(len(prompt) - 1, ids.shape[1] - 1), targets[len(prompt) - 1:]].sum()))
    return out


def spin_margin(model: Path, own: list[dict]) -> float:
    """mean over prompts of log pi(y_ref) - mean_k log pi(y_own_k), y_own = the SFT model's samples."""
    by_prompt = defaultdict(list)
    for r in own:
        by_prompt[r["index"]].append(r)
    prompts = sorted(by_prompt)
    refs = sequence_log_probs(model, [(by_prompt[i][0]["prompt"], by_prompt[i][0]["ground_truth"]) for i in prompts])
    mine = sequence_log_probs(model, [(r["prompt"], r["response"]) for i in prompts for r in by_prompt[i]])
    per = [refs[j] - sum(mine[j * SAMPLES:(j + 1) * SAMPLES]) / SAMPLES for j in range(len(prompts))]
    return sum(per) / len(per)


def win_rate(new: list[dict], old: list[dict]) -> tuple[float, float]:
    """(mean, standard error over prompts) of the per-prompt mean over sample pairs of
    sigmoid(r_new - r_old) (Bradley-Terry on the reward)."""
    a, b = defaultdict(list), defaultdict(list)
    for r in new:
        a[r["index"]].append(r["score"])
    for r in old:
        b[r["index"]].append(r["score"])
    per = [sum(1 / (1 + math.exp(-(x - y))) for x in a[i] for y in b[i]) / (len(a[i]) * len(b[i])) for i in a]
    mean = sum(per) / len(per)
    return mean, math.sqrt(sum((x - mean) ** 2 for x in per) / (len(per) - 1) / len(per))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sft", type=Path, required=True)
    parser.add_argument("--work", type=Path, default=Path("/tmp/selfplay-bench"))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--only", choices=("spin", "sppo"), default="", help="run one of the two")
    parser.add_argument("--override", nargs="*", default=[], help="key=value overrides of the SPPO run")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    sft = args.sft.resolve()
    table = []

    if args.only != "sppo":
        table += run_spin(args, sft)
    if args.only != "spin":
        table += run_sppo(args, sft)
    print(f"{'model':<22} {'self-play figure':<26} {'held-out (arith reward)':<34} train s")
    for label, figure, held_out, secs in table:
        print(f"{label:<22} {figure:<26} {held_out:<34} {secs:7.0f}")


def run_spin(args, sft: Path) -> list[tuple]:
    table = []
    spin = project(args.work, "spin-arith-cpu", sft, "--sft", "--limit", "150", "--val-fraction", "0.25")
    train_file, held_spin = spin / "data/arith-sft/train.parquet", spin / "data/arith-sft/test.parquet"
    own = generations(spin / "models/sft", train_file, args.work / "sft-own.jsonl", n=SAMPLES, temperature=1.0)
    trained, seconds = train(spin, "spin-arith-cpu", args.steps, args.seed)
    for label, model, secs in (("SFT model", spin / "models/sft", 0.0), (f"SPIN, {args.steps} steps", trained, seconds)):
        acc, _ = accuracy(generations(model, held_spin, args.work / f"{model.name}-spin-greedy.jsonl"))
        table.append((label, f"margin {spin_margin(model, own):+.2f} nats", f"held-out acc {acc:.3f}", secs))
    return table


def preference(overrides: list[str]) -> str:
    """The SPPO run's reward function (its preference model's score): an override, else the recipe's."""
    import tomllib

    chosen = [o.split("=", 1)[1].strip('"') for o in overrides if o.startswith("reward.function=")]
    recipe = tomllib.loads((REPO / "recipes" / "sppo-arith-cpu.toml").read_text())
    return chosen[-1] if chosen else recipe["reward"]["function"]


def run_sppo(args, sft: Path) -> list[tuple]:
    """Win rate against the SFT model on 100 of the training prompts and on the 100 held-out ones,
    under the run's own preference model (Bradley-Terry on its reward function)."""
    table, reward = [], preference(args.override)
    # the recipe's data/arith, less the 100 sums the SFT model's split held out (so they stay unseen)
    sppo = project(args.work, "sppo-arith-cpu", sft, "--sft", "--val-fraction", "0.25")
    sets = {"train": sppo / "data/arith-sft/train.parquet", "held-out": sppo / "data/arith-sft/test.parquet"}
    trained, seconds = train(sppo, "sppo-arith-cpu", args.steps, args.seed, *args.override,
                             'data.train_files=["data/arith-sft/train.parquet"]',
                             'data.val_files=["data/arith-sft/test.parquet"]')
    for split, data in sets.items():
        before, after = (generations(model, data, args.work / f"{name}-{split}.jsonl", n=SAMPLES, temperature=1.0,
                                     reward=reward, limit=100)
                         for name, model in (("sft", sppo / "models/sft"), ("sppo", trained)))
        for label, rows, secs, (win, se) in ((f"SFT model ({split})", before, 0.0, (0.5, 0.0)),
                                       (f"SPPO {args.steps} st. ({split})", after, seconds, win_rate(after, before))):
            acc, score = accuracy(rows)
            table.append((label, f"win rate vs SFT {win:.3f} +- {se:.3f}",
                          f"exact acc {acc:.3f}, {reward} {score:.3f} (T=1)", secs))
    return table


if __name__ == "__main__":
    main()
