"""Model FLOPs utilisation (MFU): the FLOPs a step needs over what the devices could do in its time.

    shape = ModelShape.from_hf_config(config_json)          # matmul parameters, layers, attention width
    fwd = forward_flops(shape, prompt_tokens=..., response_tokens=..., rows=..., group_size=n)
    mfu = forward_equivalents * fwd / step_s / peak         # peak: matmul_peak() summed over ranks

One formula for `rlctl train` (the `perf/mfu` metric) and bench/rlctl_bench.py. It counts the
work a step *needs*, not what a tool happens to compute: each prompt once (its n samples share
it), every generated token, no padding, no recomputation (gradient checkpointing). Imports
nothing heavy; `matmul_peak` imports torch when called.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping

# A backward pass costs two forwards (gradients of the inputs and of the weights); with frozen
# base weights (LoRA) only the input gradients are needed.
BACKWARD_FULL = 2.0
BACKWARD_FROZEN = 1.0


@dataclass(frozen=True)
class ModelShape:
    matmul_params: int   # weights multiplied per token: attention + MLP projections (+ lm_head)
    layers: int
    attention_dim: int   # heads x head_dim: the width of QK^T and AV

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any] | Any, *, lm_head: bool = True) -> "ModelShape":
        """From a transformers config (config.json as a dict, or a PretrainedConfig) of a decoder with a
        gated MLP (Llama / Qwen / Mistral family). lm_head=False: a value model (critic), whose
        1-wide head is negligible. Embedding lookups are not matmuls and are not counted."""
        get = cfg.get if isinstance(cfg, Mapping) else (lambda key, default=None: getattr(cfg, key, default))
        h, layers, inter = int(get("hidden_size")), int(get("num_hidden_layers")), int(get("intermediate_size"))
        heads = int(get("num_attention_heads"))
        head_dim = int(get("head_dim", None) or h // heads)
        kv_heads = int(get("num_key_value_heads", None) or heads)
        q, kv = heads * head_dim, kv_heads * head_dim
        per_layer = 2 * h * q + 2 * h * kv + 3 * h * inter     # q, o; k, v; gate, up, down
        head = h * int(get("vocab_size")) if lm_head else 0
        return cls(matmul_params=layers * per_layer + head, layers=layers, attention_dim=q)


def forward_flops(shape: ModelShape, *, prompt_tokens: float, response_tokens: float, rows: int,
                  group_size: int) -> float:
    """FLOPs of one forward pass over a step's batch.

    prompt_tokens / response_tokens: summed over the `rows` sequences (each row counts its prompt,
    so a prompt shared by a group of `group_size` samples is in it group_size times). A token
    costs 2 x matmul_params; causal attention costs 2 x layers x attention_dim x S^2 per row
    (QK^T and AV, half of the S x S scores), with S the mean row length.
    """
    distinct = prompt_tokens / group_size + response_tokens
    seq = (prompt_tokens + response_tokens) / rows
    return 2.0 * shape.matmul_params * distinct + rows * 2.0 * shape.layers * shape.attention_dim * seq * seq


def training_forward_equivalents(*, epochs: int, frozen_weights: bool = False) -> float:
    """Forward-equivalents of `epochs` passes of forward + backward over the batch."""
    return epochs * (1.0 + (BACKWARD_FROZEN if frozen_weights else BACKWARD_FULL))


def mfu(flops: float, seconds: float, peak_flops: float) -> float:
    """Achieved model FLOP/s over the peak FLOP/s (a fraction; 0 when nothing can be said)."""
    if seconds <= 0 or peak_flops <= 0:
        return 0.0
    return flops / seconds / peak_flops


@lru_cache(maxsize=None)
def matmul_peak(device: str = "cpu", dtype: str = "float32", *, size: int = 0, budget_s: float = 0.1) -> float:
    """FLOP/s of a square torch.mm on `device` in `dtype` at this process's thread count: the best
    of repeated timed products (at most ~budget_s of timing after one warm-up). Cached per process,
    so a worker measures once. size 0: 1024 on CPU (it reaches the peak there), 8192 on GPU."""
    import torch

    n = size or (8192 if device.startswith("cuda") else 1024)
    dev, dt = torch.device(device), getattr(torch, dtype)
    x, y = torch.randn(n, n, device=dev).to(dt), torch.randn(n, n, device=dev).to(dt)

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    torch.mm(x, y)   # warm-up: kernel selection, thread pool start, lazy allocation
    sync()
    best, spent = float("inf"), 0.0
    for _ in range(10):
        start = time.perf_counter()
        torch.mm(x, y)
        sync()
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
        if spent > budget_s:
            break
    return 2.0 * n ** 3 / best
