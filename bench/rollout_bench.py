#!/usr/bin/env python3
"""Generation speed: rlctl's `hf` rollout engine against plain `model.generate`, same batch.

  .venv/bin/python bench/rollout_bench.py [--sizes tiny,small] [--threads 1,2] [--reps 5]

The batch is one step of ../shared/bench's workload: 4 chat prompts (78-126 tokens) x 8 samples
= 32 sequences, up to 64 new tokens, T=1, top_p=1, top_k=0, fp32, models built by
../shared/bench/tiny_model.py (seed 0) into /tmp/bench-models. Two stopping rules:
  eos   : stop at <|im_end|>/<|endoftext|> (what training does). Real tokens = tokens up to and
          including each row's EOS; slots = rows x decode steps the call ran (HF generate keeps
          every row until the last one stops).
  full64: EOS ignored, exactly 32 x 64 = 2048 tokens for both (limits_bench.py's measurement).
tok/s and slots/s are medians of per-call rates. Median of --reps after --warmup rounds, round-robin so slow periods of the shared machine hit
every method alike; `foreign` = cores used by other processes meanwhile (from /proc/stat).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
REPO = Path(__file__).resolve().parents[1]
SHARED_BENCH = Path(os.environ.get("RLCTL_SHARED", REPO.parent / "shared")) / "bench"
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(SHARED_BENCH))

import workload as W  # noqa: E402  (../shared/bench/workload.py: prompts, HostLoad)

NEW_TOKENS = W.MAX_COMPLETION_LENGTH


def load(size: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = Path(f"/tmp/bench-models/{size}")
    if not (model_dir / "model.safetensors").exists():
        import tiny_model

        tiny_model.build(str(model_dir), size, seed=0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompts = [tok.apply_chat_template(r["prompt"], tokenize=True, add_generation_prompt=True,
                                       return_dict=True)["input_ids"]
               for r in W.make_rows()[: W.PROMPTS_PER_STEP]]
    return tok, model, prompts


def methods(tok, model, prompts):
    """name -> fn() returning (real generated tokens, slots) of one call."""
    import torch

    from rlctl.workers.rollout.hf import HFRolloutEngine

    n, rows = W.NUM_GENERATIONS, W.BATCH
    eos = list(model.generation_config.eos_token_id)
    batch = [p for p in prompts for _ in range(n)]
    enc = tok.pad({"input_ids": batch}, return_tensors="pt", padding_side="left")
    plen = enc["input_ids"].shape[1]
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)

    def plain(full: bool):
        def run():
            kw = dict(min_new_tokens=NEW_TOKENS) if full else dict(eos_token_id=eos)
            with torch.no_grad():
                out = model.generate(**enc, max_new_tokens=NEW_TOKENS, do_sample=True, temperature=1.0,
                                     top_k=0, top_p=1.0, pad_token_id=tok.pad_token_id, **kw)[:, plen:]
            if full:
                return out.numel(), out.numel()
            is_eos = torch.isin(out, torch.tensor(eos))
            # a row's real tokens: up to and including its first EOS, else all of them
            first = torch.where(is_eos.any(-1), is_eos.int().argmax(-1) + 1, out.shape[1])
            return int(first.sum()), out.numel()
        return run

    def engine(full: bool, fast: bool = True):
        eng = HFRolloutEngine(model, pad_token_id=tok.pad_token_id, eos_token_ids=[-1] if full else eos,
                              fast=fast)

        def run():
            out = eng.generate(prompts, n=n, max_new_tokens=NEW_TOKENS, generator=gen)
            return int(out["response_length"].sum()), rows * eng.last_stats["decode_steps"]
        return run

    return {"generate/eos": plain(False), "rlctl-hf/eos": engine(False),
            "rlctl-hf(hf-forward)/eos": engine(False, fast=False),
            "generate/full64": plain(True), "rlctl-hf/full64": engine(True)}


def measure(fns: dict, reps: int, warmup: int) -> tuple[dict, float]:
    times = {k: [] for k in fns}
    counts = {k: [] for k in fns}
    host = None
    for rnd in range(warmup + reps):
        if rnd == warmup:
            host = W.HostLoad()
        for name, fn in fns.items():
            t0 = time.perf_counter()
            tokens, slots = fn()
            if rnd >= warmup:
                times[name].append(time.perf_counter() - t0)
                counts[name].append((tokens, slots))
    result = {}
    for name in fns:
        s = statistics.median(times[name])
        tokens = sum(c[0] for c in counts[name]) / reps
        slots = sum(c[1] for c in counts[name]) / reps
        tok_s = statistics.median(c[0] / t for c, t in zip(counts[name], times[name]))
        slot_s = statistics.median(c[1] / t for c, t in zip(counts[name], times[name]))
        result[name] = dict(s=s, tokens=tokens, slots=slots, tok_s=tok_s, slot_s=slot_s,
                            spread=(min(times[name]), max(times[name])))
    return result, host.foreign_cores()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="tiny,small")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--methods", default="", help="comma-separated subset of the method names")
    a = ap.parse_args(argv)
    import torch
    import transformers

    print(f"torch={torch.__version__} transformers={transformers.__version__} batch={W.BATCH} "
          f"({W.PROMPTS_PER_STEP} prompts x {W.NUM_GENERATIONS}) new_tokens<={NEW_TOKENS} reps={a.reps}")
    print("| size | threads | method | median s [min-max] | real tokens | tok/s | slots/s | tok/s vs generate | foreign cores |")
    print("|---|---|---|---|---|---|---|---|---|")
    for size in a.sizes.split(","):
        tok, model, prompts = load(size)
        for threads in (int(t) for t in a.threads.split(",")):
            torch.set_num_threads(threads)
            fns = methods(tok, model, prompts)
            if a.methods:
                fns = {k: v for k, v in fns.items() if k in a.methods.split(",")}
            res, foreign = measure(fns, a.reps, a.warmup)
            for name, r in res.items():
                base = res.get("generate/" + name.split("/")[1], r)["tok_s"]
                print(f"| {size} | {threads} | {name} | {r['s']:.3f} [{r['spread'][0]:.3f}-{r['spread'][1]:.3f}] "
                      f"| {r['tokens']:.0f} | {r['tok_s']:.0f} | {r['slot_s']:.0f} | {r['tok_s'] / base:.2f}x "
                      f"| {foreign:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
