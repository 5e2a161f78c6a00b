"""SFT throughput: rlctl's SFT (`rlctl train` of an sft-arith-cpu project) vs TRL's SFTTrainer.

Same tiny model (`rlctl model tiny`, seed 0), same data (`rlctl data prep arith --sft`: 360
chat prompts, answers of 1-2 digits), same steps, batch, learning rate and schedule (linear
warm-up, cosine to 0.1 x lr), max length 128, loss on the completion only, fp32 on CPU.
For each tool: median step time, tokens/s (non-padding tokens per step / step time, what rlctl
logs as perf/tokens_per_s), final loss, and the foreign CPU load (cores other tenants of the VM
used meanwhile: /proc/stat busy time minus the run's own process tree, bench/proctree.py).

rlctl runs in a subprocess (`python -m rlctl train`, its real path: embedded Ray, the worker
group); its figures come from the run's metrics.jsonl. TRL runs bench/trl_sft_side.py in the
TRL venv that ../shared/bench/BASELINE.md builds (--trl-python); without one, only rlctl runs.
Neither tool's start-up (Ray, imports, tokenising) is in step time; the first --warmup steps
are left out of the medians.

    python bench/sft_trl_e2e_bench.py --steps 60 --trl-python /tmp/venv-trl/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from proctree import TreeSampler, idle_probe  # noqa: E402

HERE = Path(__file__).resolve().parent


def rlctl(*args: str, cwd: Path, env: dict) -> None:
    subprocess.run([sys.executable, "-m", "rlctl", *args], cwd=cwd, env=env, check=True,
                   stdout=subprocess.DEVNULL)


def prepare(work: Path, a, env: dict) -> None:
    """A fresh sft-arith-cpu project in `work` with the tiny model and the SFT data."""
    shutil.rmtree(work, ignore_errors=True)
    work.parent.mkdir(parents=True, exist_ok=True)
    rlctl("init", str(work), "--recipe", "sft-arith-cpu", cwd=work.parent, env=env)
    rlctl("model", "tiny", "models/tiny", "--layers", str(a.layers), "--hidden", str(a.hidden), cwd=work, env=env)
    rlctl("data", "prep", "arith", "--sft", cwd=work, env=env)


def timed(cmd: list[str], cwd: Path, env: dict) -> tuple[float, float, str]:
    """Run cmd; (wall s, foreign cores over the run, combined output)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with TreeSampler(proc.pid) as sampler:
        out, _ = proc.communicate()
    t1 = time.perf_counter()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed (exit {proc.returncode}):\n{out[-3000:]}")
    return t1 - t0, sampler.foreign_cores(t0, t1), out


def run_rlctl(work: Path, a, workers: int, cpus: int, env: dict) -> dict:
    name = f"bench-{workers}x{cpus}"
    overrides = [f"run.name={name}", f"run.total_steps={a.steps}", f"data.batch_size={a.batch}",
                 f"actor.lr={a.lr}", f"actor.warmup_steps={a.lr_warmup}", "actor.min_lr_ratio=0.1",
                 f"sft.max_length={a.max_length}", f"run.save_every={a.steps}", "run.val_every=0",
                 f"resources.workers={workers}", f"resources.cpus_per_worker={cpus}", "run.loggers=[\"jsonl\"]"]
    wall, foreign, _ = timed([sys.executable, "-m", "rlctl", "train", *overrides], work, env)
    rows = [json.loads(line) for line in (work / "runs" / name / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "train/loss" in r]
    measured = rows[a.warmup:]
    step_s = statistics.median(r["timing/step_s"] for r in measured)
    tok_s = sum(r["train/tokens"] for r in measured) / sum(r["timing/step_s"] for r in measured)
    return {"tool": f"rlctl {workers}x{cpus}", "step_s": step_s, "tokens_per_s": tok_s,
            "tokens_per_step": statistics.mean(r["train/tokens"] for r in measured),
            "loss_tokens_per_step": statistics.mean(r["train/loss_tokens"] for r in measured),
            "final_loss": rows[-1]["train/loss"], "foreign_cores": foreign, "wall_s": wall}


def run_trl(work: Path, a, threads: int, env: dict) -> dict:
    out_json = work / f"trl-{threads}.json"
    cmd = [a.trl_python, str(HERE / "trl_sft_side.py"), "--model", "models/tiny",
           "--data", "data/arith-sft/train.parquet", "--steps", str(a.steps), "--warmup-steps", str(a.warmup),
           "--batch", str(a.batch), "--lr", str(a.lr), "--lr-warmup", str(a.lr_warmup),
           "--max-length", str(a.max_length), "--threads", str(threads), "--json", str(out_json)]
    trl_env = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    wall, foreign, _ = timed(cmd, work, trl_env)
    s = json.loads(out_json.read_text())["summary"]
    return {"tool": f"TRL {threads} thread(s)", "step_s": s["step_s"], "tokens_per_s": s["tokens_per_s"],
            "tokens_per_step": s["tokens_per_step"], "loss_tokens_per_step": s["loss_tokens_per_step"],
            "final_loss": s["final_loss"], "foreign_cores": foreign, "wall_s": wall,
            "versions": s["versions"]}


def table(results: list[dict]) -> str:
    head = "| tool | step_s (median) | tokens/s | tokens/step | loss tokens/step | final loss | wall s | foreign cores |"
    lines = [head, "|" + "---|" * 8]
    for r in results:
        lines.append(f"| {r['tool']} | {r['step_s']:.3f} | {r['tokens_per_s']:.0f} | {r['tokens_per_step']:.0f} | "
                     f"{r['loss_tokens_per_step']:.0f} | {r['final_loss']:.4f} | {r['wall_s']:.1f} | "
                     f"{r['foreign_cores']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/tmp/rlctl-sft-trl-e2e-bench", help="scratch project folder (recreated)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--lr-warmup", type=int, default=10)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--splits", default="2x1,1x2", help="rlctl resources.workers x cpus_per_worker, comma-separated")
    ap.add_argument("--trl-python", default="/tmp/venv-trl/bin/python", help="python of a venv with trl")
    ap.add_argument("--trl-threads", default=f"{os.cpu_count() or 1},1", help="torch threads for TRL, comma-separated")
    ap.add_argument("--json", default="", help="write the figures here")
    a = ap.parse_args(argv)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
           "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    work = Path(a.work).resolve()
    print(f"foreign CPU load before: {max(0.0, idle_probe(2.0)):.2f} cores busy (this process idle)", flush=True)
    prepare(work, a, env)
    results = []
    for split in [s for s in a.splits.split(",") if s]:
        workers, cpus = (int(x) for x in split.split("x"))
        results.append(run_rlctl(work, a, workers, cpus, env))
        print(f"{results[-1]['tool']}: step_s={results[-1]['step_s']:.3f} tokens_per_s={results[-1]['tokens_per_s']:.0f}",
              flush=True)
    if Path(a.trl_python).exists():
        for threads in sorted({int(t) for t in a.trl_threads.split(",") if t}, reverse=True):
            results.append(run_trl(work, a, threads, env))
            print(f"{results[-1]['tool']}: step_s={results[-1]['step_s']:.3f} "
                  f"tokens_per_s={results[-1]['tokens_per_s']:.0f}", flush=True)
    else:
        print(f"no TRL venv at {a.trl_python}: build one as ../shared/bench/BASELINE.md says; rlctl only", flush=True)
    print(f"\nmodel {a.layers}x{a.hidden} (rlctl model tiny), {a.steps} steps of {a.batch} examples, lr {a.lr}, "
          f"max length {a.max_length}; medians after {a.warmup} warm-up steps; {os.cpu_count()} cores\n")
    print(table(results))
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
