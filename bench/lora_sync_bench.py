#!/usr/bin/env python3
"""LoRA weight sync to vLLM on CPU: the adapter alone against the merged model, and what unmerged
LoRA costs at decode time.

  .venv/bin/python bench/lora_sync_bench.py MODEL_DIR [--rank 16] [--pushes 5] [--prompts 16]
        [--new-tokens 64] [--json out.json]

rlctl's own code path (rlctl.workers.rollout.adapter_sync.push_weights into VLLMRolloutEngine), on a
peft model of MODEL_DIR with LoRA on every linear layer ("all-linear", B random so the adapter is
not zero), fp32, enforce_eager. Two engines, one after the other in this process:
  merged   a plain engine; each push sends W + s B A for every weight (what model.lora.sync =
           "merged" sends), then greedy decode with the pushed weights;
  adapter  an engine with LoRA enabled; each push writes the adapter to tmpfs and loads it under a
           new name (model.lora.sync = "adapter"), then greedy decode with the adapter applied.
Printed per mode: MB sent per push, median seconds per push (after one warm-up push), and decode
tokens/s for --prompts prompts x --new-tokens tokens (ignore_eos, one warm-up round first).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path[:0] = [str(Path(__file__).resolve().parents[1])]


def peft_policy(model_dir: str, rank: int):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return get_peft_model(base, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear",
                                           init_lora_weights=False))


def decode_rate(engine, prompts: int, new_tokens: int) -> float:
    from vllm import SamplingParams

    requests = [{"prompt_token_ids": [5 + (7 * i + j) % 1000 for j in range(32)]} for i in range(prompts)]
    params = SamplingParams(max_tokens=new_tokens, temperature=0.0, ignore_eos=True, detokenize=False)
    engine.llm.generate(requests, params, use_tqdm=False, lora_request=engine.adapter)   # warm-up
    start = time.perf_counter()
    out = engine.llm.generate(requests, params, use_tqdm=False, lora_request=engine.adapter)
    return sum(len(o.outputs[0].token_ids) for o in out) / (time.perf_counter() - start)


def measure(mode: str, a, policy) -> dict:
    import torch

    from rlctl.config.schema import Config, LoraConfig, ModelConfig
    from rlctl.workers.rollout.adapter_sync import push_weights
    from rlctl.workers.rollout.gpu import GPUEngineSpec
    from rlctl.workers.rollout.vllm import VLLMRolloutEngine

    adapter = mode == "adapter"
    spec = GPUEngineSpec(model_path=a.model, dtype="float32", max_model_len=256, seed=0, enforce_eager=True,
                         lora_rank=a.rank if adapter else 0)
    start = time.perf_counter()
    engine = VLLMRolloutEngine(spec, pad_token_id=0, eos_token_ids=[0])
    built_s = time.perf_counter() - start
    config = Config(model=ModelConfig(path=a.model, lora=LoraConfig(rank=a.rank, alpha=2.0 * a.rank)))
    pushes = [push_weights(engine, policy, config, adapter=adapter, version=v + 1, dtype=torch.float32)
              for v in range(a.pushes + 1)][1:]
    rate = decode_rate(engine, a.prompts, a.new_tokens)
    engine.close()
    return {"mode": mode, "engine_start_s": built_s, "sync_mb": pushes[-1]["weight_sync_mb"],
            "sync_s_median": statistics.median(p["weight_sync_s"] for p in pushes),
            "decode_tokens_per_s": rate}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--pushes", type=int, default=5)
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--json")
    a = p.parse_args()
    import torch

    torch.set_num_threads(1)
    policy = peft_policy(a.model, a.rank)
    rows = [measure(mode, a, policy) for mode in ("merged", "adapter")]
    for r in rows:
        print(f"{r['mode']:8s} sync {r['sync_mb']:8.2f} MB  {r['sync_s_median']:7.3f} s/push   "
              f"decode {r['decode_tokens_per_s']:7.1f} tok/s   (engine start {r['engine_start_s']:.1f} s)")
    if a.json:
        Path(a.json).write_text(json.dumps({"args": vars(a), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
