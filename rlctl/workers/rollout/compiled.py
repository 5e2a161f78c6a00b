"""A decode step's per-layer work compiled by torch.compile (inductor, CPU): `CompiledLayers`.

A DecoderRunner decode step at a few dozen rows runs ~80 small operations per layer around its
four matmuls (RMSNorm's square / mean / rsqrt / scale, dtype casts, RoPE, the KV write, attention's
bias, softmax and gathers, SiLU gating, residual adds), each a separate CPU kernel with its own
dispatch and memory pass. Inductor fuses them into a few C++ loops; the packed oneDNN matmuls
(rlctl.workers.rollout.packed) stay as they are, called through one opaque op (`rlctl::packed_linear`:
inductor has no lowering for an already-packed weight).

Two graphs serve every layer, its halves around the KV write (`layer_qkv`, `layer_rest`): they take
the layer's tensors as arguments (no module is traced, so nothing is specialised on which layer it
is), and the row count, the prompts' width and the step's column are dynamic, so finished rows drop
out without a recompile. The KV write itself stays eager, in place: a graph that writes into a view
of the cache copied the whole view back on every call. A process compiles a few graphs per model
shape, dtype and autocast setting (before and after the first row ends, one live row, a batch or n
of 1: torch specialises the sizes 0 and 1); the first step (column 0, also specialised) runs eagerly.
Compiling costs seconds once per process (compile_seconds(), reported as perf/compile_s); inductor's
on-disk cache (torch's default, under its temporary directory) makes a later run's compile cheaper.

What it saves is not yet more than what it costs on SmolLM2-135M at 32 rows, 1 thread (docs/
benchmarks.md): the fused kernels take less time than the eager operations, but each of the 60 graph
calls per step pays dynamo's guard check and each of the 120 matmuls the custom op's Python dispatch.

Only where it can run: a CPU, a C++ compiler, every projection packed (plain nn.Linear: not LoRA or
quantized layers), RMSNorm norms and a SiLU-gated MLP (`CompiledLayers.of` says None otherwise and the
runner decodes eagerly). The result is the eager step's maths with inductor's own reduction order, so
logits agree within float rounding, not bitwise (tests/workers/rollout/test_compiled_decode.py).
"""

from __future__ import annotations

import shutil
import time
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F

from rlctl.workers.rollout.attention import decode_attention, rope
from rlctl.workers.rollout.packed import FusedLinear


@torch.library.custom_op("rlctl::packed_linear", mutates_args=())
def packed_linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], out_features: int) -> torch.Tensor:
    """FusedLinear.joined's matmul on a weight packed by oneDNN (out_features: its output width,
    which the packed tensor's shape does not say to a tracer)."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


@packed_linear.register_fake
def _(x, weight, bias, out_features):
    return x.new_empty((*x.shape[:-1], out_features))


class Shape(NamedTuple):
    """What every layer of the model shares (constants of the compiled graph)."""
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int     # the MLP's gate (= up) width
    eps: float            # the RMSNorms' epsilon
    q_scale: float        # what attention still multiplies the scores by (1.0 when folded into q)
    dtype: torch.dtype    # the packed linears' dtype


def rms_norm(h: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' LlamaRMSNorm (also Qwen2's, Qwen3's, Mistral's) on explicit tensors."""
    x = h.to(torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(h.dtype)


def _linear(x: torch.Tensor, packed: tuple[torch.Tensor, Optional[torch.Tensor], int], dtype: torch.dtype):
    return packed_linear(x.to(dtype), *packed)


def layer_qkv(h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, weights: tuple, shape: Shape):
    """A decoder layer's first half, DecoderRunner.decode's on explicit tensors: h [A, hidden] ->
    q [A, kv, G, D] (RoPE'd), k [A, kv, D] (RoPE'd), v [A, kv, D]. weights: (input norm,
    post-attention norm, q_norm or None, k_norm or None, qkv, o, gate_up, down), each linear
    (packed weight, bias or None, out_features)."""
    norm1, _, q_norm, k_norm, qkv_w = weights[:5]
    rows, heads, kv, dim = h.shape[0], shape.heads, shape.kv_heads, shape.head_dim
    qkv = _linear(rms_norm(h, norm1, shape.eps), qkv_w, shape.dtype).view(rows, heads + 2 * kv, dim)
    if q_norm is not None:
        q = rope(rms_norm(qkv[:, :heads], q_norm, shape.eps), cos, sin)
        k = rope(rms_norm(qkv[:, heads:heads + kv], k_norm, shape.eps), cos, sin)
    else:
        qk = rope(qkv[:, :heads + kv], cos, sin)
        q, k = qk[:, :heads], qk[:, heads:]
    return q.reshape(rows, kv, heads // kv, dim), k, qkv[:, heads + kv:]


def layer_rest(h: torch.Tensor, q: torch.Tensor, n: int, weights: tuple, cache: tuple,
               slot: Optional[torch.Tensor], shape: Shape) -> torch.Tensor:
    """The layer's second half: attention over cache (kg [A, kv, D, t], vg [A, kv, t, D] of the
    live rows, this step's keys and values already written; kp, vp [B, kv, P, D], the prompt bias),
    the o projection, the MLP and both residual adds -> h. Nothing here writes to its inputs: a
    compiled graph that mutates a view of the cache copied the whole view back on every call."""
    _, norm2, _, _, _, o_w, gate_up_w, down_w = weights
    out = decode_attention(q, *cache[2:4], *cache[:2], cache[4], slot, n, shape.q_scale)
    h = h + _linear(out.reshape(h.shape[0], -1), o_w, shape.dtype)
    gate, up = _linear(rms_norm(h, norm2, shape.eps), gate_up_w, shape.dtype).split(shape.intermediate, dim=-1)
    return h + _linear(F.silu(gate) * up, down_w, shape.dtype)


_compiled = None
_compile_s = 0.0   # this process's seconds of decode steps that compiled a graph


def _compiled_halves():
    """layer_qkv and layer_rest compiled once per process (dynamo keeps graphs by a function's code)."""
    global _compiled
    if _compiled is None:
        _compiled = torch.compile(layer_qkv, dynamic=True), torch.compile(layer_rest, dynamic=True)
    return _compiled


def compile_seconds() -> float:
    """Seconds this process has spent in decode steps that compiled a graph (the steps' own run
    included), for perf/compile_s."""
    return _compile_s


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


class CompiledLayers:
    """A DecoderRunner's layers through the compiled halves, one call of each per layer."""

    def __init__(self, runner, shape: Shape, weights: list[tuple]):
        self.runner, self.shape, self.weights = runner, shape, weights
        self.qkv, self.rest = _compiled_halves()

    @classmethod
    def of(cls, runner) -> "CompiledLayers | None":
        """For a runner whose projections are packed (call after they are built), or None where the
        compiled layer would not be the runner's own function or cannot be built here."""
        if runner.device.type != "cpu" or not (shutil.which("g++") or shutil.which("c++")):
            return None
        weights = []
        for layer, proj in zip(runner.layers, runner.proj):
            norms, linears = _norms(layer, runner.has_qk_norm), [proj.qkv, proj.o, proj.gate_up, proj.down]
            if not (all(_is_rms_norm(m) for m in norms) and all(isinstance(p, FusedLinear) for p in linears)
                    and type(proj.act).__name__ in ("SiLU", "SiLUActivation")):
                return None
            norm_w = [m.weight for m in norms] + [None, None] * (not runner.has_qk_norm)
            weights.append((*norm_w, *((p.weight, p.bias, sum(p.sizes)) for p in linears)))
        eps = {float(m.variance_epsilon) for layer in runner.layers for m in _norms(layer, runner.has_qk_norm)}
        if len(eps) != 1:
            return None
        shape = Shape(runner.heads, runner.kv_heads, runner.head_dim, runner.proj[0].gate_up.sizes[0], eps.pop(),
                      runner.proj[0].q_scale, runner.linear_dtype)
        return cls(runner, shape, weights)

    def __call__(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, col: int) -> torch.Tensor:
        global _compile_s
        r, rows = self.runner, h.shape[0]
        graphs, start = _graphs(), time.perf_counter()
        # no "duck" sizes: the live rows equal the cache's rows until a row ends, and a guard on that
        # would cost a second graph
        slot = None if r.in_order else r.slot
        for i, weights in enumerate(self.weights):
            q, k, v = self.qkv(h, cos, sin, weights, self.shape)
            r.kg[i, :rows, :, :, col] = k   # between the halves, eagerly: in place
            r.vg[i, :rows, :, col] = v
            cache = (r.kg[i, :rows, :, :, :col + 1], r.vg[i, :rows, :, :col + 1], r.kp[i], r.vp[i], r.prompt_bias)
            h = self.rest(h, q, r.n, weights, cache, slot, self.shape)
        if _graphs() != graphs:
            _compile_s += time.perf_counter() - start
        return h


def _norms(layer, qk_norm: bool) -> list:
    attn = layer.self_attn
    return [layer.input_layernorm, layer.post_attention_layernorm] + ([attn.q_norm, attn.k_norm] if qk_norm else [])


def _is_rms_norm(module) -> bool:
    """transformers' RMSNorm of the Llama family (the formula rms_norm repeats)."""
    return (type(module).__name__ in ("LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MistralRMSNorm")
            and hasattr(module, "variance_epsilon"))
