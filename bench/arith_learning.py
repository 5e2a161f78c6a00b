"""Learning per step, rlctl beside TRL: the `grpo-arith-smollm2-cpu` recipe and TRL's GRPOTrainer on the
same prompts, reward and settings (bench/trl_arith_learning.py), over seeds; prints the mean reward of each
step for both (mean over seeds, and the lowest and highest seed), and each tool's median step time.

    .venv/bin/python bench/arith_learning.py --model-dir DIR --trl-venv /tmp/venv-trl --seeds 0,1,2 --steps 12

rlctl runs `rlctl train` of the recipe as `rlctl init` writes it (one worker with 2 threads, the hf engine),
with `model.dtype` from --dtype and validation off; TRL runs with bf16 autocast when --dtype is bfloat16.
One seed of each tool at a time, rlctl first, so both see the same machine. The two tools draw different
prompts for a step (each its own seeded sampler over the same parquet), so compare curves, not steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


def rlctl_run(model_dir: str, root: Path, seed: int, steps: int, dtype: str) -> list[dict]:
    def rlctl(*args, cwd):
        done = subprocess.run([sys.executable, "-m", "rlctl", *map(str, args)], cwd=cwd, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"rlctl {' '.join(map(str, args))} failed:\n{done.stderr[-2000:]}")

    proj = root / f"rlctl-{seed}"
    rlctl("init", proj, "--recipe", "grpo-arith-smollm2-cpu", "--model", model_dir, cwd=root)
    rlctl("data", "prep", "arith", "--val-fraction", "0.25", cwd=proj)
    rlctl("train", f"run.seed={seed}", f"run.total_steps={steps}", f"model.dtype={dtype}", "data.val_files=[]",
          "run.save_every=0", cwd=proj)
    lines = (proj / "runs" / "grpo-arith-smollm2-cpu" / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    return [{"step": r["step"], "reward": r["reward/mean"], "step_s": r["timing/step_s"]} for r in rows]


def trl_run(venv: str, model_dir: str, data: Path, root: Path, seed: int, steps: int, bf16: bool) -> list[dict]:
    out = root / f"trl-{seed}.json"
    cmd = [str(Path(venv) / "bin" / "python"), str(HERE / "trl_arith_learning.py"), "--data", str(data),
           "--model-dir", model_dir, "--seed", str(seed), "--steps", str(steps), "--json", str(out),
           *(["--bf16"] if bf16 else [])]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"TRL failed:\n{done.stderr[-3000:]}")
    return json.loads(out.read_text())["steps"]


def spread(values: list[float]) -> str:
    return f"{statistics.mean(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", required=True, help="SmolLM2-135M-Instruct (`rlctl model get`)")
    ap.add_argument("--trl-venv", required=True)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    seeds = [int(s) for s in a.seeds.split(",")]
    model_dir = str(Path(a.model_dir).resolve())
    os.environ.setdefault("OMP_NUM_THREADS", "2")
    runs: dict[str, dict[int, list[dict]]] = {"rlctl": {}, "trl": {}}
    with tempfile.TemporaryDirectory(prefix="arith-learning-") as tmp:
        root = Path(tmp)
        for seed in seeds:
            runs["rlctl"][seed] = rlctl_run(model_dir, root, seed, a.steps, a.dtype)
            data = root / f"rlctl-{seed}" / "data" / "arith" / "train.parquet"
            runs["trl"][seed] = trl_run(a.trl_venv, model_dir, data, root, seed, a.steps, a.dtype == "bfloat16")
            print(f"seed {seed}: rlctl {[round(s['reward'], 3) for s in runs['rlctl'][seed]]}", flush=True)
            print(f"seed {seed}: TRL   {[round(s['reward'], 3) for s in runs['trl'][seed]]}", flush=True)
    print(f"\nmean reward a step over seeds {a.seeds} (lowest-highest seed), model.dtype {a.dtype}\n")
    print("| step | rlctl | TRL |\n|---|---|---|")
    for i in range(a.steps):
        cells = [spread([runs[tool][s][i]["reward"] for s in seeds if len(runs[tool][s]) > i]) for tool in runs]
        print(f"| {i + 1} | {cells[0]} | {cells[1]} |")
    for tool in runs:
        times = [step["step_s"] for s in seeds for step in runs[tool][s][1:]]
        first = statistics.mean(statistics.mean(step["reward"] for step in runs[tool][s][:3]) for s in seeds)
        last = statistics.mean(statistics.mean(step["reward"] for step in runs[tool][s][-3:]) for s in seeds)
        median = statistics.median(times)
        print(f"{tool}: first 3 steps {first:.3f} -> last 3 steps {last:.3f}; median step {median:.1f} s")
    if a.json:
        Path(a.json).write_text(json.dumps({"dtype": a.dtype, "seeds": seeds, "runs": runs}))


if __name__ == "__main__":
    main()
