"""Ulysses sequence parallelism: one packed micro-batch split along the sequence over S ranks.

The S ranks of an sp group hold the same micro-batch. Its real tokens are packed into one row
[1, N] (rlctl.workers.compute.logprob's "pack" layout: position_ids restart at 0 per sequence), padded to
N' = a multiple of S, and rank r runs the model on columns [r N'/S, (r+1) N'/S). Everything but
attention is per token, so it runs on the slice unchanged (RoPE reads the slice's position_ids).
Attention needs every token: an all-to-all turns q/k/v [1, h, N'/S, d] into [1, h/S, N', d]
(all tokens, a slice of the heads), SDPA runs causally within each packed sequence (never across
them, and without an [N', N'] mask; a layer's sliding window and logit soft-cap per sequence too,
packed_attention), and a second all-to-all turns the output back. KV heads fewer than S are
repeated first. Attention variants it does not implement (sinks, ALiBi) are refused by name.

Each rank then computes its slice's per-token outputs (log-probs, entropy) and `gather_rows`
puts the S slices together on every rank, so the loss is the same on all of them. Its backward
keeps the rank's own slice of the gradient times S: the S ranks' parameter gradients then sum
to S x dL/dtheta, which FSDP's average over dp x sp ranks turns into the dp-average it expects
(the loss is normalised with dp_size = world / S, rlctl.workers.compute.training).

The training engine owns a model's sp group (rlctl.workers.compute.engine.TrainEngine.sp, built by
engine.sequence_group) and hands it to each pass that splits (rlctl.workers.compute.logprob's `sp=`); a
forward's attention function is bound to the group and the packed row's sequences for that forward.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.distributed as dist
import torch.nn.functional as F

from rlctl.models.anatomy import attention_as, causal_lm_parts

ATTENTION = "rlctl_ulysses"


@dataclass
class SPGroup:
    """This rank's sequence-parallel group: `size` ranks, this one at `rank` within it."""

    group: object          # torch.distributed ProcessGroup
    rank: int
    size: int
    global_ranks: list[int]


def build_group(size: int, model: torch.nn.Module, world: int, key: str = "ulysses_sequence_parallel_size"
                ) -> SPGroup | None:
    """This rank's group of `size` ranks (None when 1) for `model`, after the checks validate makes
    (rlctl.workers.parallel.ulysses_checks), repeated here for a model that was not on disk then."""
    from rlctl.errors import ConfigError

    if size == 1:
        return None
    if world % size:
        raise ConfigError(f"{world} training ranks do not split into sequence-parallel groups of {size}",
                          hint=f"set {key} to a divisor of the ranks")
    text = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    heads = text.num_attention_heads
    problem = head_problem(heads, getattr(text, "num_key_value_heads", None) or heads, size)
    if problem:
        raise ConfigError(problem, hint=f"set {key} to a size that divides the heads")
    if sinks := next((name for name, _ in model.named_parameters() if name.rsplit(".", 1)[-1] == "sinks"), None):
        raise ConfigError(f"{sinks}: attention sinks are not implemented by sequence parallelism",
                          hint=f"set {key} = 1")
    return new_groups(size)


def attention_variant_problem(model_type: str, config: dict | None = None) -> str | None:
    """Validate's view of a model family's attention: the variant (UNSUPPORTED_ATTENTION) its
    transformers attention passes to the attention function, read from the family's modeling
    source without importing it; None when it passes none (or the family is not transformers').
    ALiBi counts where `config` (config.json) does not turn it off (Falcon's "alibi": false)."""
    import importlib.util
    from pathlib import Path

    from transformers.models.auto.configuration_auto import model_type_to_module_name

    module = model_type_to_module_name(model_type)
    spec = importlib.util.find_spec("transformers")
    source = Path(spec.origin).parent / "models" / module / f"modeling_{module}.py"
    if not source.is_file():
        return None
    text = source.read_text(encoding="utf-8")
    for name in UNSUPPORTED_ATTENTION:
        if name == "alibi" and not (config or {}).get("alibi", True):
            continue
        if f"{name}=self." in text or f"{name}={name}" in text:
            return f"{model_type}'s attention passes {name}, which sequence parallelism does not implement"
    return None


def new_groups(size: int) -> SPGroup | None:
    """Split the process group's W ranks into W / size consecutive sp groups (every rank creates
    every group, as torch.distributed requires); this rank's group, or None when size is 1."""
    if size <= 1:
        return None
    rank, world = dist.get_rank(), dist.get_world_size()
    if world % size:
        raise ValueError(f"{world} ranks do not split into sp groups of {size}")
    mine = None
    for start in range(0, world, size):
        ranks = list(range(start, start + size))
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = SPGroup(group=group, rank=rank - start, size=size, global_ranks=ranks)
    return mine


def head_problem(heads: int, kv_heads: int, size: int) -> str | None:
    """Why `size` cannot split attention of `heads` query and `kv_heads` key/value heads, or None."""
    if heads % size:
        return f"the model's {heads} attention heads do not split over {size} ranks"
    if kv_heads % size and size % kv_heads:
        return f"the model's {kv_heads} KV heads neither split over {size} ranks nor divide {size}"
    return None


def sequence_lengths(position_ids: torch.Tensor) -> list[int]:
    """The lengths of the sequences of a packed row [N] (a sequence starts where position_ids is 0)."""
    starts = torch.nonzero(position_ids == 0).flatten().tolist() + [len(position_ids)]
    return [b - a for a, b in zip(starts, starts[1:])]


# --- the all-to-all around attention ------------------------------------------------------------
class _AllToAll(torch.autograd.Function):
    """[S, ...] -> [S, ...]: part j goes to rank j; part i of the result came from rank i. The
    exchange is its own inverse's shape, so backward sends the gradients back the same way."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group):
        ctx.group = group
        x = x.contiguous()   # the output must be contiguous too (empty_like keeps a permuted x's strides)
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


def _all_to_all(x: torch.Tensor, sp: SPGroup) -> torch.Tensor:
    return _AllToAll.apply(x, sp.group)


def seq_to_heads(x: torch.Tensor, sp: SPGroup) -> torch.Tensor:
    """[b, h, s/S, d] (all heads, this rank's tokens) -> [b, h/S, s, d] (this rank's heads, all tokens)."""
    b, h, s_local, d = x.shape
    parts = x.reshape(b, sp.size, h // sp.size, s_local, d).transpose(0, 1)    # [S, b, h/S, s/S, d]
    got = _all_to_all(parts, sp)                                                # [S(from), b, h/S, s/S, d]
    return got.permute(1, 2, 0, 3, 4).reshape(b, h // sp.size, sp.size * s_local, d)


def heads_to_seq(x: torch.Tensor, sp: SPGroup) -> torch.Tensor:
    """The inverse of seq_to_heads: [b, h/S, s, d] -> [b, h, s/S, d]."""
    b, h_local, s, d = x.shape
    parts = x.reshape(b, h_local, sp.size, s // sp.size, d).permute(2, 0, 1, 3, 4)   # [S, b, h/S, s/S, d]
    got = _all_to_all(parts, sp)                                                      # [S(from), b, h/S, s/S, d]
    return got.transpose(0, 1).reshape(b, sp.size * h_local, s // sp.size, d)


# The attention variants a model may hand the attention function, with what sp does with them.
# Implemented per packed sequence: a sliding window (Gemma 2/3, Mistral v0.1, Phi-3) and logit
# soft-capping (Gemma 2). Anything else that shapes the scores would be silently dropped, so it is
# refused: attention sinks (gpt-oss's s_aux), ALiBi / position biases, chunked windows.
UNSUPPORTED_ATTENTION = ("s_aux", "sinks", "alibi", "position_bias", "window_size", "head_mask")


def unsupported_attention(kwargs: dict) -> str | None:
    """The first attention variant in an attention call's keyword arguments that Ulysses attention
    does not implement, or None."""
    for name in UNSUPPORTED_ATTENTION:
        if kwargs.get(name) is not None:
            return name
    if kwargs.get("is_causal") is False:
        return "is_causal=False"
    return None


QUERY_BLOCK = 1024   # queries per masked attention call: masks and scores [h, 1024, keys], never [h, L, L]


def packed_attention(q, k, v, lengths: list[int], *, scaling=None, dropout: float = 0.0,
                     sliding_window: int | None = None, softcap: float | None = None) -> torch.Tensor:
    """Causal attention inside each packed sequence, never across: q/k/v [b, h, N, d] (same heads)
    -> [b, h, N, d]. Position i of a sequence sees j <= i, and with a window only i - j < window
    (transformers' sliding-window mask). Plain sequences go to SDPA with is_causal (no mask); a
    sequence the window cuts, or soft-capped logits (tanh(s / c) * c before the mask, softmax in
    float32, as transformers' eager attention), runs in blocks of QUERY_BLOCK queries, each
    against the keys it can see (the last `window` ones, with a window), so its masks and scores
    grow with L x min(L, window + QUERY_BLOCK), not L^2."""
    parts = []
    for qi, ki, vi in zip(q.split(lengths, 2), k.split(lengths, 2), v.split(lengths, 2)):
        n = qi.shape[2]
        windowed = sliding_window is not None and n > sliding_window
        if softcap is None and not windowed:
            parts.append(F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scaling, dropout_p=dropout))
            continue
        for q0 in range(0, n, QUERY_BLOCK):
            q1 = min(n, q0 + QUERY_BLOCK)
            k0 = max(0, q0 - sliding_window + 1) if windowed else 0
            parts.append(_masked_block(qi[:, :, q0:q1], ki[:, :, k0:q1], vi[:, :, k0:q1], q0 - k0,
                                       sliding_window if windowed else None, scaling, dropout, softcap))
    return torch.cat(parts, dim=2)


def _masked_block(q, k, v, offset: int, window: int | None, scaling, dropout: float, softcap: float | None):
    """Queries q [b, h, m, d] at key positions offset .. offset + m - 1 of k/v [b, h, offset + m, d]."""
    pos_q = torch.arange(offset, offset + q.shape[2], device=q.device)[:, None]
    pos_k = torch.arange(k.shape[2], device=q.device)[None, :]
    allowed = pos_k <= pos_q
    if window is not None:
        allowed &= pos_k > pos_q - window
    if softcap is None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, scale=scaling, dropout_p=dropout)
    scores = torch.matmul(q, k.transpose(2, 3)) * (q.shape[-1] ** -0.5 if scaling is None else scaling)
    scores = torch.tanh(scores / softcap) * softcap
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(F.dropout(weights, p=dropout, training=dropout > 0), v)


def ulysses_attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0,
                      sliding_window=None, softcap=None, *, sp: SPGroup, lengths: list[int], **kwargs):
    """A transformers attention function (bound to `sp` and the packed row's sequence `lengths` by
    _routed): q [b, h, s/S, d], k/v [b, hk, s/S, d] -> ([b, s/S, h, d], None).

    KV heads fewer than S are repeated to S first, each consecutively, so rank j's query heads
    (a slice inside one KV group) meet their own KV head."""
    from rlctl.errors import ConfigError

    if variant := unsupported_attention(kwargs):
        raise ConfigError(f"{type(module).__name__} uses an attention variant ({variant}) that sequence "
                          "parallelism does not implement", hint="set actor.ulysses_sequence_parallel_size = 1")
    kv_heads = key.shape[1]
    if kv_heads < sp.size:
        key = key.repeat_interleave(sp.size // kv_heads, dim=1)
        value = value.repeat_interleave(sp.size // kv_heads, dim=1)
    q, k, v = (seq_to_heads(t, sp) for t in (query, key, value))
    if k.shape[1] != q.shape[1]:
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    out = packed_attention(q, k, v, lengths, scaling=scaling, dropout=dropout if module.training else 0.0,
                           sliding_window=sliding_window, softcap=softcap)
    return heads_to_seq(out, sp).transpose(1, 2).contiguous(), None


def _routed(config, attention):
    """The model's attention is `attention` (ulysses_attention bound to a group and a packed row)
    inside; its own again afterwards."""
    return attention_as(config, ATTENTION, attention)


def recompute_with_routing(context_fn, model: torch.nn.Module):
    """Gradient checkpointing: `context_fn` (torch.utils.checkpoint's, as
    rlctl.workers.compute.shared_prompt.checkpoint_kwargs makes it) plus, for a layer whose forward ran
    Ulysses attention, its recompute in backward under the same attention, group and packed
    sequences (backward runs after `sliced_forward` has handed the model its own attention back)."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    config = causal_lm_parts(model).config

    def both():
        forward, recompute = context_fn()
        if config._attn_implementation != ATTENTION:
            return forward, recompute
        return forward, _recompute(recompute, config, ALL_ATTENTION_FUNCTIONS[ATTENTION])   # entered in backward

    return both


@contextlib.contextmanager
def _recompute(recompute, config, attention) -> Iterator[None]:
    with recompute, _routed(config, attention):
        yield


# --- the sliced forward and the gather of its outputs -------------------------------------------
@dataclass
class Slice:
    """Where this rank's part of a packed row sits: columns [start, stop) of the padded row, and
    the predictors (indices into the layout's M response tokens) [bounds[r], bounds[r+1]) of rank r."""

    start: int
    stop: int
    bounds: list[int]


def sliced_forward(model: torch.nn.Module, sp: SPGroup, input_ids: torch.Tensor, position_ids: torch.Tensor,
                   pred_col: torch.Tensor, *, head_only_preds: bool = True):
    """Run `model` on this rank's slice of a packed row [1, N] (padded to a multiple of S with a
    sequence of its own). Returns (model output, Slice); the output's logits are those of this
    rank's predictor columns (pred_col must be sorted, as the pack layout makes it) when
    head_only_preds, else of every column of the slice."""
    n = input_ids.shape[1]
    padded = -(-n // sp.size) * sp.size
    extra = torch.arange(padded - n, device=input_ids.device)[None]
    ids = torch.cat([input_ids, torch.zeros_like(extra)], dim=1)
    positions = torch.cat([position_ids, extra], dim=1)
    width = padded // sp.size
    start = sp.rank * width
    bounds = torch.searchsorted(pred_col, torch.arange(0, padded + 1, width, device=pred_col.device)).tolist()
    kwargs = {}
    if head_only_preds:
        kwargs["logits_to_keep"] = pred_col[bounds[sp.rank]:bounds[sp.rank + 1]] - start
    attention = functools.partial(ulysses_attention, sp=sp, lengths=sequence_lengths(positions[0]))
    with _routed(causal_lm_parts(model).config, attention):
        out = model(input_ids=ids[:, start:start + width], position_ids=positions[:, start:start + width],
                    use_cache=False, **kwargs)
    return out, Slice(start=start, stop=start + width, bounds=bounds)


class _GatherRows(torch.autograd.Function):
    """All-gather of the S ranks' row blocks (sizes `bounds`); backward keeps this rank's rows x S."""

    @staticmethod
    def forward(ctx, local: torch.Tensor, sp: SPGroup, bounds: list[int]):
        ctx.sp, ctx.bounds = sp, bounds
        sizes = [b - a for a, b in zip(bounds, bounds[1:])]
        longest = max(sizes)
        padded = local.new_zeros((longest, *local.shape[1:]))
        padded[:local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(sp.size)]
        dist.all_gather(parts, padded.contiguous(), group=sp.group)
        return torch.cat([part[:size] for part, size in zip(parts, sizes)])

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        sp, bounds = ctx.sp, ctx.bounds
        return grad[bounds[sp.rank]:bounds[sp.rank + 1]] * sp.size, None, None


def gather_rows(local: torch.Tensor, sp: SPGroup, bounds: list[int]) -> torch.Tensor:
    """[m_r, ...] on each rank r -> [M, ...] (rank 0's rows first) on every rank of the group."""
    return _GatherRows.apply(local, sp, bounds)


# --- the rows an sp group works on --------------------------------------------------------------
def group_rows(batch, sp: SPGroup | None, mini_batches: int = 1):
    """The rows of the whole sp group, the same on each of its ranks, and where this rank's own
    rows sit in them (start, stop). The dispatcher gave each rank its own shard; the S ranks then
    work on the union, and each keeps the outputs of its own rows. Mini-batch k of the union is
    the union of the shards' mini-batches k (`mini_batches` equal chunks, as the update cuts them)."""
    from rlctl.runtime.batch import Batch

    if sp is None:
        return batch, 0, len(batch)
    shards: list = [None] * sp.size
    dist.all_gather_object(shards, batch, group=sp.group)
    if mini_batches > 1:
        chunks = [shard.chunk(mini_batches, even=True) for shard in shards]
        rows = Batch.concat([chunks[r][k] for k in range(mini_batches) for r in range(sp.size)])
    else:
        rows = Batch.concat(shards)
    start = sum(len(shard) for shard in shards[:sp.rank])
    return rows, start, start + len(batch)
