"""Decode-time linear layers with their weights reordered once per generate (CPU, oneDNN).

A decode step multiplies a few dozen rows by every weight of the model. At that shape a plain
CPU matmul spends as much time re-blocking the weight into the kernel's layout as multiplying,
on every call. Within one `generate` the weights do not change, so `FusedLinear` casts them to
the step's dtype and blocks them once (`torch.ops.mkldnn._reorder_linear_weight`), fusing the
projections that read the same input (q, k, v; gate, up) into one matmul each. On SmolLM2-135M's
shapes at 32 rows (2 threads, AVX-512-BF16) the matmuls take up to 1.6x less time in bfloat16, with
results bitwise equal to F.linear, and up to 2.8x less in float32 (the vocabulary head), within
float32 rounding of it; a decode step 1.25-1.5x less (bench/decode_bench.py, docs/benchmarks.md).

Only plain `nn.Linear` modules on CPU are packed: a LoRA or quantized layer, a GPU, or a torch
without oneDNN keeps the module's own forward (`FusedLinear.of` returns None), so what runs is
always the trained module's function. The packed copy lives as long as the DecoderRunner (one
generate), in place of the bfloat16 copies autocast would cache for the modules.
"""

from __future__ import annotations

from typing import Sequence

import torch

PACKED_DTYPES = (torch.float32, torch.bfloat16)


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN's prepacked linear runs here: a CPU tensor of a dtype it packs."""
    return (device.type == "cpu" and dtype in PACKED_DTYPES and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


class FusedLinear:
    """x -> [x W_1^T + b_1, x W_2^T + b_2, ...] as one oneDNN matmul over the stacked weights.

    __call__(x [..., K]) returns the outputs split by module (a tuple) or, for one module, the
    output itself, in `dtype` (x is cast to it, as autocast would)."""

    def __init__(self, modules: Sequence[torch.nn.Linear], dtype: torch.dtype, rows_hint: int,
                 row_scale: Sequence[float] | None = None):
        scale = row_scale or [1.0] * len(modules)
        weight = torch.cat([_scaled(m.weight.detach().to(dtype), f) for m, f in zip(modules, scale)])   # [sum N, K]
        biases = [m.bias for m in modules]
        self.bias = None if all(b is None for b in biases) else torch.cat(
            [_scaled((b.detach() if b is not None else m.weight.new_zeros(m.out_features)).to(dtype), f)
             for b, m, f in zip(biases, modules, scale)])
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, max(1, rows_hint))
        self.dtype, self.sizes = dtype, [m.out_features for m in modules]

    @classmethod
    def of(cls, modules: Sequence[torch.nn.Module], dtype: torch.dtype, rows_hint: int,
           row_scale: Sequence[float] | None = None) -> "FusedLinear | None":
        """The packed form of `modules`, or None where it would not be the same function (not all
        plain nn.Linear of one input size, or not on a CPU with oneDNN). row_scale: one factor per
        module, multiplied into its weight and bias (module i's output comes out times it)."""
        if not all(type(m) is torch.nn.Linear and not hasattr(m.weight, "device_mesh") for m in modules):
            return None   # LoRA / quantized layers, or FSDP shards (DTensors) outside whole_weights
        if len({m.in_features for m in modules}) != 1 or not packing_available(modules[0].weight.device, dtype):
            return None
        return cls(modules, dtype, rows_hint, row_scale)

    def joined(self, x: torch.Tensor) -> torch.Tensor:
        """The modules' outputs side by side, [..., sum N], as the one matmul gives them."""
        return torch.ops.mkldnn._linear_pointwise(x.to(self.dtype), self.weight, self.bias, "none", [], "")

    def __call__(self, x: torch.Tensor):
        out = self.joined(x)
        return out if len(self.sizes) == 1 else out.split(self.sizes, dim=-1)


def _scaled(t: torch.Tensor, factor: float) -> torch.Tensor:
    return t if factor == 1.0 else t * factor


def linear_or_module(modules: Sequence[torch.nn.Module], dtype: torch.dtype, rows_hint: int, pack: bool = True):
    """A callable x -> the modules' outputs (a tuple for several): packed where FusedLinear.of
    allows (and `pack`), else the modules' own forwards."""
    packed = FusedLinear.of(modules, dtype, rows_hint) if pack else None
    if packed is not None:
        return packed
    if len(modules) == 1:
        return modules[0]
    return lambda x: tuple(m(x) for m in modules)
