#!/usr/bin/env python3
"""The built-in engine serving LoRA adapters: decode tokens/s of the base model, of one adapter, and of
a batch whose rows mix the base and two adapters (one gathered LoRA matmul per layer, rlctl.models.lora_slots).

  .venv/bin/python bench/serve_lora_bench.py MODEL_DIR [--rank 16] [--requests 16] [--new-tokens 64]

rlctl.serve.engine.Engine in this process (no HTTP), float32, two peft adapters on every linear layer
(B random). Each case submits --requests greedy requests of a 32-token prompt at once (ignore_eos) and
times them to the last token, after one warm-up round of the same case.
"""

from __future__ import annotations

import argparse
import os
import queue
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path[:0] = [str(Path(__file__).resolve().parents[1])]


def make_adapter(model_dir: str, out: Path, rank: int, seed: int) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear",
                                     init_lora_weights=False)).save_pretrained(out)
    return out


def rate(engine, names: list[str], new_tokens: int) -> float:
    from rlctl.api.requests import Request, SamplingParams

    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    events: queue.Queue = queue.Queue()
    start = time.perf_counter()
    for i, name in enumerate(names):
        engine.submit(Request([5 + (7 * i + j) % 1000 for j in range(32)], params, events, index_base=i, adapter=name))
    finished, tokens = 0, 0
    while finished < len(names):
        ev = events.get()
        if ev.finish_reason:
            finished, tokens = finished + 1, tokens + ev.completion_tokens
    return tokens / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=64)
    a = p.parse_args()
    import torch

    from rlctl.serve.engine import Engine
    from rlctl.serve.server import served_adapters
    from rlctl.serve.source import load_model

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    with tempfile.TemporaryDirectory() as tmp:
        specs = [(f"a{i}", make_adapter(a.model, Path(tmp) / f"a{i}", a.rank, i)) for i in range(2)]
        model, tokenizer = load_model(Path(a.model), "float32", "cpu")
        served = served_adapters(model, "base", {"adapters": specs, "slots": 2, "max_rank": a.rank})
        engine = Engine(model, tokenizer, max_rows=a.requests, adapters=served)
        cases = {"base": [""] * a.requests, "one adapter": ["a0"] * a.requests,
                 "mixed: base, a0, a1": ["", "a0", "a1"] * (a.requests // 3) + [""] * (a.requests % 3)}
        try:
            for case, names in cases.items():
                rate(engine, names, a.new_tokens)   # warm-up
                print(f"{case:22s} {rate(engine, names, a.new_tokens):7.1f} tok/s")
        finally:
            engine.shutdown(timeout=5)


if __name__ == "__main__":
    main()
