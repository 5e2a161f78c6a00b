"""Each phase's floor: no faster than its FLOPs at the matmul peak, nor than its bytes at the memory bandwidth.

    shape = MemoryShape.from_hf_config(config_json, dtype_bytes=2)   # bfloat16 weights and KV cache
    floor_s = generation_floor(shape, flops_shape, prompt_lengths, response_lengths, group_size=n,
                               ranks=1, peak_flops=peak, bandwidth=bw)

Generation is judged step by step: a decode step of A live rows must read every weight once and
each row's KV cache (its prompt's, shared by the prompt's samples, read once per prompt, and its
own tokens so far), and must do 2 x matmul_params FLOPs per row plus attention; it takes at least
the larger of the two times. With few live rows the bytes bind, with many the FLOPs, so the sum of
per-step maxima is the floor (a max of the phase's totals would hide the switch). The prefill is one
forward over the prompts (each once) with one read of the weights. The ranks decode their rows at
the same time on one machine, sharing its bandwidth and its peak: their FLOPs and bytes add up.

The reference and training passes are FLOP-bound on any model worth training, but their bytes
count too: the weights once per micro-batch forward (three times with the backward), and AdamW's
step reads parameter, gradient and both moments and writes three of them, in float32.

Pure arithmetic on numbers and sequences; `read_bandwidth` imports torch when called.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping, Sequence

from rlctl.utils.flops import ModelShape

ADAM_BYTES_PER_PARAM = 7 * 4   # reads p, g, m, v and writes p, m, v, each float32


@dataclass(frozen=True)
class MemoryShape:
    weight_bytes: float        # matmul weights (lm_head included) in the compute dtype: read once per forward
    kv_bytes_per_token: float  # keys + values of one token over all layers
    params: int                # trained parameters (the optimizer's step touches each)

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any], *, dtype_bytes: int) -> "MemoryShape":
        h, layers, heads = int(cfg["hidden_size"]), int(cfg["num_hidden_layers"]), int(cfg["num_attention_heads"])
        head_dim = int(cfg.get("head_dim") or h // heads)
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        matmul = ModelShape.from_hf_config(cfg).matmul_params
        embedding = 0 if cfg.get("tie_word_embeddings", False) else h * int(cfg["vocab_size"])
        return cls(weight_bytes=float(matmul * dtype_bytes), kv_bytes_per_token=float(2 * layers * kv_heads * head_dim
                                                                                      * dtype_bytes),
                   params=matmul + embedding)


def decode_steps(prompt_lengths: Sequence[int], response_lengths: Sequence[int], group_size: int,
                 ranks: int = 1) -> list[tuple[int, float, float, float]]:
    """(live rows, KV tokens read, KV tokens attended, rank-steps) of every decode step, all ranks together.

    Rows are prompt-major (group_size samples per prompt, the prompts split over `ranks` as
    consecutive parts, earlier parts larger); a row of R tokens is live for decode steps 1..R-1
    (the first token comes from the prefill), reading at step j its own j tokens and, once per
    prompt while any of its samples is live, the prompt's. Attended: every live row's query meets
    its own j keys and all of its prompt's, so a prompt's keys count once per live sample there
    (the FLOPs), once per prompt in the bytes. rank-steps: ranks still decoding."""
    prompts = len(response_lengths) // group_size
    if prompts * group_size != len(response_lengths) or len(prompt_lengths) != len(response_lengths):
        raise ValueError("prompt and response lengths must be one per row, group_size rows per prompt")
    longest = [max(int(r) for r in response_lengths[g * group_size:(g + 1) * group_size]) for g in range(prompts)]
    base, extra = divmod(prompts, ranks)
    rank_of = [r for r in range(ranks) for _ in range(base + (r < extra))]   # Batch.chunk's split
    steps = []
    for j in range(1, max(longest, default=0)):
        live = sum(1 for r in response_lengths if r > j)
        groups = [g for g in range(prompts) if longest[g] > j]
        tokens = float(j * live + sum(prompt_lengths[g * group_size] for g in groups))
        attended = float(j * live + sum(p for p, r in zip(prompt_lengths, response_lengths) if r > j))
        steps.append((live, tokens, attended, float(len({rank_of[g] for g in groups}))))
    return steps


def generation_floor(memory: MemoryShape, flops: ModelShape, prompt_lengths: Sequence[int],
                     response_lengths: Sequence[int], *, group_size: int, ranks: int, peak_flops: float,
                     bandwidth: float) -> dict[str, float]:
    """Seconds generation cannot beat: prefill + every decode step, each the larger of FLOPs / peak
    and bytes / bandwidth. Returns floor_s, flops_s and bytes_s (the two bounds' own sums) and
    bytes_bound (the share of the floor's time spent in bandwidth-bound steps)."""
    prompts = prompt_lengths[::group_size]
    prefill_flops = sum(2.0 * flops.matmul_params * p + 2.0 * flops.layers * flops.attention_dim * p * p
                        for p in prompts)
    prefill_bytes = memory.weight_bytes * ranks + memory.kv_bytes_per_token * sum(prompts)
    parts = [(prefill_flops, prefill_bytes)]
    for rows, kv_tokens, attended, rank_steps in decode_steps(prompt_lengths, response_lengths, group_size, ranks):
        # every live row: one token through the weights and attention over its whole context (attended, summed)
        parts.append((2.0 * flops.matmul_params * rows + 4.0 * flops.layers * flops.attention_dim * attended,
                      memory.weight_bytes * rank_steps + memory.kv_bytes_per_token * (kv_tokens + rows)))  # + new KV
    times = [(f / peak_flops, b / bandwidth) for f, b in parts]
    floor = sum(max(f, b) for f, b in times)
    return {"floor_s": floor, "flops_s": sum(f for f, _ in times), "bytes_s": sum(b for _, b in times),
            "bytes_bound": sum(b for f, b in times if b > f) / floor if floor else 0.0}


def pass_floor(forward_flops: float, memory: MemoryShape, *, forwards: float, micro_batches: int,
               optimizer_step: bool, peak_flops: float, bandwidth: float) -> float:
    """A log-prob pass (forwards = 1) or a training pass (3: forward + backward, optimizer_step):
    the larger of its FLOPs at the peak and its bytes (the weights once per micro-batch forward,
    x forwards; AdamW's step) at the bandwidth."""
    bytes_ = memory.weight_bytes * forwards * micro_batches + (ADAM_BYTES_PER_PARAM * memory.params
                                                              if optimizer_step else 0.0)
    return max(forwards * forward_flops / peak_flops, bytes_ / bandwidth)


@lru_cache(maxsize=None)
def read_bandwidth(device: str = "cpu", *, size_mib: int = 256, budget_s: float = 0.5) -> float:
    """Bytes/s of a streaming read (torch.sum over a float32 buffer of size_mib, larger than any
    cache) at this process's thread count: the best of repeated timed reads after one warm-up."""
    import torch

    dev = torch.device(device)
    x = torch.ones(size_mib * 2 ** 20 // 4, device=dev)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    x.sum()
    sync()
    best, spent = float("inf"), 0.0
    for _ in range(20):
        start = time.perf_counter()
        x.sum()
        sync()
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
        if spent > budget_s:
            break
    return x.numel() * 4 / best
