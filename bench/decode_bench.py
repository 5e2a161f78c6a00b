#!/usr/bin/env python3
"""The hf engine's generate on a real model, with and without packed linears, in one process.

  .venv/bin/python bench/decode_bench.py --model-dir models/smollm2 --data data/gsm8k/train.parquet
        [--prompts 4 --n 8 --max-new 160] [--rounds 3] [--compile] [--profile]

The first --prompts prompts of a parquet (rendered as training renders them) x --n samples, <= --max-new
tokens, T = 1, bf16 autocast over float32 weights (as the actor's rank runs it; --dtype float32 for
none), --threads threads. Rounds alternate unpacked and packed (rlctl.workers.rollout.packed) on the
same generator seed, so a slow spell hits both and the tokens must be equal; each prints the whole
generate (wall and CPU seconds), the decode steps' sum and median (ms at the median live rows) and the rest (prefill,
sampling, row drops), then the generation floor (rlctl.utils.roofline) of the packed round's rows.
Then `sample_tokens` alone on [rows, vocab] logits, and each of the model's decode matmuls at the
live-row count (rows x in x out: q/k/v fused, o, gate/up fused, down, lm_head) plain (F.linear) and
packed (FusedLinear), in float32 and bfloat16. Last, a decode step's budget at --dtype: the packed matmuls
of every layer and the head, and decode attention alone, each against its own floor (what the step costs
before any of its other operations). --compile: each round also runs the packed engine with
its decode layers compiled (rlctl.workers.rollout.compiled; the compile paid in a warm-up generate and
printed), and says whether it drew the same tokens. --profile: torch.profiler's top operations of one
packed (or, with --compile, compiled) generate instead.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--data", required=True, help="a verl-schema parquet (e.g. rlctl data prep gsm8k's train)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-new", type=int, default=160)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--profile", action="store_true")
    a = ap.parse_args(argv)

    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlctl.data.dataset import chat_prompt_ids
    from rlctl.utils.flops import ModelShape, matmul_peak
    from rlctl.utils.roofline import MemoryShape, generation_floor, read_bandwidth
    from rlctl.workers.rollout import decoder, packed
    from rlctl.workers.rollout.hf import HFRolloutEngine
    from rlctl.workers.rollout.token_sampling import sample_tokens

    torch.set_num_threads(a.threads)
    tok = AutoTokenizer.from_pretrained(a.model_dir)
    model = AutoModelForCausalLM.from_pretrained(a.model_dir, dtype=torch.float32)
    rows = pq.read_table(a.data).slice(0, a.prompts).to_pylist()
    prompts = [chat_prompt_ids(list(r["prompt"]), tok) for r in rows]
    engine = HFRolloutEngine(model, pad_token_id=tok.pad_token_id or 0, eos_token_ids=[tok.eos_token_id])
    autocast = torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.dtype == "bfloat16")

    steps: list[tuple[int, float]] = []   # (live rows, seconds) of each decode step
    decode = decoder.DecoderRunner.decode

    def timed_decode(self, tokens, positions):
        t0 = time.perf_counter()
        out = decode(self, tokens, positions)
        steps.append((tokens.shape[0], time.perf_counter() - t0))
        return out

    decoder.DecoderRunner.decode = timed_decode
    real_of = packed.FusedLinear.of.__func__

    cpu_s = [0.0]   # the last generate's CPU seconds (all threads): steadier than wall on a shared machine

    def generate(seed: int, packing: bool, compiled: bool = False):
        packed.FusedLinear.of = classmethod(real_of if packing else (lambda cls, *x, **k: None))
        engine.compile = "on" if compiled else "off"
        steps.clear()
        with autocast:
            t0, c0 = time.perf_counter(), time.process_time()
            out = engine.generate(prompts, n=a.n, max_new_tokens=a.max_new, temperature=1.0,
                                  generator=torch.Generator().manual_seed(seed))
        cpu_s[0] = time.process_time() - c0
        return time.perf_counter() - t0, out

    generate(0, True)   # warm-up: allocator, oneDNN kernels
    if a.compile:
        wall, _ = generate(0, True, compiled=True)
        print(f"compile warm-up: generate {wall:.2f} s, of which decode steps that compiled "
              f"{engine.last_stats['compile_s']:.2f} s", flush=True)
    if a.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            generate(1, True, compiled=a.compile)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))
        return 0
    lengths = None
    for r in range(a.rounds):
        tokens = {}
        modes = [("unpacked", False, False), ("packed", True, False)] + [("compiled", True, True)] * a.compile
        for name, packing, compiled in modes:
            wall, out = generate(r + 1, packing, compiled)
            tokens[name] = out["responses"]
            dec = [s for _, s in steps]
            live = statistics.median(n for n, _ in steps) if steps else 0
            print(f"round {r} {name:8s}: generate {wall:.2f} s ({cpu_s[0]:.2f} s CPU), {int(out['response_length'].sum())} tokens, "
                  f"{len(dec)} decode steps {sum(dec):.2f} s (median {statistics.median(dec) * 1e3:.1f} ms at "
                  f"{live:.0f} live rows), rest {wall - sum(dec):.2f} s", flush=True)
            lengths = out["response_length"].tolist()
        same = bool((tokens["packed"] == tokens["unpacked"]).all())
        print(f"round {r}: the same tokens packed and unpacked: {same}"
              + (f", compiled and packed: {bool((tokens['compiled'] == tokens['packed']).all())}" if a.compile else ""))
    cfg = json.loads((Path(a.model_dir) / "config.json").read_text())
    peak, bandwidth = matmul_peak("cpu", a.dtype), read_bandwidth("cpu")
    memory = MemoryShape.from_hf_config(cfg, dtype_bytes=2 if a.dtype == "bfloat16" else 4)
    shape = ModelShape.from_hf_config(cfg)
    floor = generation_floor(memory, shape, [len(p) for p in prompts for _ in range(a.n)],
                             lengths, group_size=a.n, ranks=1, peak_flops=peak, bandwidth=bandwidth)
    print(f"floor of the last round's rows: {floor['floor_s']:.2f} s (FLOPs {floor['flops_s']:.2f} s at "
          f"{peak / 1e9:.0f} GFLOP/s, bytes {floor['bytes_s']:.2f} s at {bandwidth / 1e9:.1f} GB/s)")
    logits = torch.randn(a.prompts * a.n, model.config.vocab_size) * 3
    g = torch.Generator().manual_seed(0)
    for _ in range(3):
        sample_tokens(logits, generator=g)
    t0 = time.perf_counter()
    for _ in range(20):
        sample_tokens(logits, generator=g)
    print(f"sample_tokens on [{logits.shape[0]} x {logits.shape[1]}] logits: "
          f"{(time.perf_counter() - t0) / 20 * 1e3:.2f} ms a call")
    per_call = matmuls(model, a.prompts * a.n)
    step_budget(cfg, shape, memory, a, per_call[a.dtype], peak, bandwidth, prompts, lengths)
    return 0


def step_budget(cfg: dict, shape, memory, a, per_call: dict, peak: float, bandwidth: float, prompts,
                lengths) -> None:
    """What the two kinds of work every decode step must do cost at --prompts x --n live rows, against
    their own floors (FLOPs at `peak`, bytes at `bandwidth`, from the model's ModelShape and MemoryShape,
    as rlctl.utils.roofline counts them): the packed matmuls of all layers and the head (per_call:
    microseconds a call, from matmuls()), and decode attention (rlctl.workers.rollout.attention) over the
    prompts' width and half the last round's longest response, each layer's."""
    import torch

    from rlctl.workers.rollout.attention import decode_attention

    rows, layers = a.prompts * a.n, shape.layers
    dtype = torch.bfloat16 if a.dtype == "bfloat16" else torch.float32
    mm_s = (layers * sum(per_call[k] for k in ("qkv", "o", "gate_up", "down")) + per_call["lm_head"]) / 1e6
    mm_floor = max(2 * rows * shape.matmul_params / peak, memory.weight_bytes / bandwidth)
    heads, kv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    dim = shape.attention_dim // heads
    plen, t, cap = max(map(len, prompts)), max(1, max(lengths) // 2), max(lengths)
    q = torch.randn(rows, kv, heads // kv, dim, dtype=dtype)
    kp, vp = (torch.randn(a.prompts, kv, plen, dim, dtype=dtype) for _ in range(2))
    kg, vg = torch.randn(rows, kv, dim, cap, dtype=dtype), torch.randn(rows, kv, cap, dim, dtype=dtype)
    bias = torch.zeros(a.prompts, 1, 1, plen, dtype=dtype)
    call = lambda: decode_attention(q, kp, vp, kg[..., :t], vg[:, :, :t], bias, None, a.n, 1.0)   # noqa: E731
    att_s = layers * call_seconds(call)
    att_flops = 4 * layers * shape.attention_dim * rows * (plen + t)   # every row attends to its prompt
    att_bytes = memory.kv_bytes_per_token * (a.prompts * plen + rows * t)   # a prompt's KV is read once
    att_floor = max(att_flops / peak, att_bytes / bandwidth)
    print(f"a decode step's matmuls at {rows} rows ({layers} layers' packed q/k/v, o, gate/up, down and the head): "
          f"{mm_s * 1e3:.1f} ms against their floor {mm_floor * 1e3:.1f} ms ({mm_s / mm_floor:.1f}x)")
    print(f"a decode step's attention at {rows} rows, {plen} prompt + {t} generated keys ({layers} layers, "
          f"decode_attention): {att_s * 1e3:.1f} ms against its floor {att_floor * 1e3:.2f} ms ({att_s / att_floor:.1f}x)")
    print(f"the two together: {(mm_s + att_s) * 1e3:.1f} ms a step against {(mm_floor + att_floor) * 1e3:.1f} ms "
          f"({(mm_s + att_s) / (mm_floor + att_floor):.2f}x of the step's floor before any other operation)")


def call_seconds(fn) -> float:
    """Seconds a call of fn takes: one call to warm up, then the median of 5 timings of 20 calls."""
    fn()
    runs = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(20):
            fn()
        runs.append((time.perf_counter() - t0) / 20)
    return statistics.median(runs)


def matmuls(model, rows: int) -> dict[str, dict[str, float]]:
    """Each decode matmul of the model's first layer and head at `rows` rows: F.linear against
    FusedLinear, float32 and bfloat16, microseconds a call (median of 5 timings of 20 calls), printed;
    returns the packed ones' microseconds by dtype name and matmul."""
    import torch

    from rlctl.workers.rollout import packed

    layer = model.model.layers[0]
    att, mlp = layer.self_attn, layer.mlp
    groups = {"qkv": [att.q_proj, att.k_proj, att.v_proj], "o": [att.o_proj],
              "gate_up": [mlp.gate_proj, mlp.up_proj], "down": [mlp.down_proj], "lm_head": [model.lm_head]}

    def timed(fn) -> float:
        return call_seconds(fn) * 1e6

    packed_us_by: dict[str, dict[str, float]] = {}
    for dtype in (torch.float32, torch.bfloat16):
        for name, mods in groups.items():
            weight = torch.cat([m.weight.detach() for m in mods]).to(dtype)
            x = torch.randn(rows, weight.shape[1]).to(dtype)
            fused = packed.FusedLinear.of(mods, dtype, rows)
            plain_us = timed(lambda: torch.nn.functional.linear(x, weight))
            packed_us = timed(lambda: fused(x)) if fused is not None else float("nan")
            print(f"{str(dtype).removeprefix('torch.'):8s} {name:8s} [{rows} x {weight.shape[1]}] x "
                  f"[{weight.shape[1]} x {weight.shape[0]}]: F.linear {plain_us:.0f} us, packed {packed_us:.0f} us")
            packed_us_by.setdefault(str(dtype).removeprefix("torch."), {})[name] = (
                packed_us if fused is not None else plain_us)
    return packed_us_by


if __name__ == "__main__":
    sys.exit(main())
