"""FSDP2 plumbing for the training engine: device, dtype, sharding, whole-weight inference.

A group of W ranks shards each decoder layer and the root with `fully_shard` (one all-gather per
layer in forward, one reduce-scatter per layer in backward; gradients are *averaged* over ranks).
With one rank the model stays a plain module. Outside a process group (tests, tools) everything
here behaves as a single rank.
"""

from __future__ import annotations

import contextlib
import math
from typing import Iterator

import torch
import torch.distributed as dist

from rlctl.errors import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def resolve_dtype(name: str) -> torch.dtype:
    """model.dtype: auto = bfloat16 on GPU, float32 on CPU (CPU bf16 matmuls are slow and lossy)."""
    if name == "auto":
        return torch.bfloat16 if torch.cuda.is_available() else torch.float32
    if name not in DTYPES:
        raise ConfigError(f"model.dtype = {name!r} is not supported", hint=f"use auto or one of {', '.join(DTYPES)}")
    return DTYPES[name]


def all_reduce_sum(values: list[float]) -> list[float]:
    """Element-wise sum over ranks (float64, on the device the backend needs)."""
    _, world = rank_and_world()
    if world == 1:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device())
    dist.all_reduce(t)
    return t.tolist()


def all_reduce_max(value: float) -> float:
    """The largest `value` over ranks."""
    _, world = rank_and_world()
    if world == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated transformer blocks, found by the model's own `_no_split_modules` names."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or [])
    return [m for m in model.modules() if type(m).__name__ in names]


def shard(model: torch.nn.Module, *, param_dtype: torch.dtype | None = None,
          ignored: set[torch.nn.Parameter] | None = None) -> torch.nn.Module:
    """fully_shard every decoder layer, then the root (embeddings, final norm, heads).

    param_dtype (e.g. bf16) is the compute dtype: parameters stay fp32 masters and are all-gathered
    in param_dtype; gradients are reduced in fp32. `ignored` parameters stay plain local tensors
    (expert-parallel banks: rlctl.workers.parallel.expert_parallel).
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    _, world = rank_and_world()
    mesh = init_device_mesh(device().type, (world,))
    mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32) if param_dtype else MixedPrecisionPolicy()
    layers = decoder_layers(model)
    if not layers:
        raise ConfigError(f"cannot find the decoder layers of {type(model).__name__} to shard",
                          hint="the model class needs `_no_split_modules` (all transformers LLMs have it)")
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp, ignored_params=ignored)
    fully_shard(model, mesh=mesh, mp_policy=mp, ignored_params=ignored)
    return model


def fsdp_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    from torch.distributed.fsdp import FSDPModule

    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def whole_weights(model: torch.nn.Module) -> Iterator[None]:
    """Inference with every FSDP unit all-gathered once (same calls, same order on every rank), and
    expert-parallel banks gathered whole (rlctl.workers.parallel.expert_parallel.whole_experts).

    With the parameters whole and reshard-after-forward off, forward runs no collective, so ranks
    may run different numbers of micro-batches (uneven splits) without deadlocking. Peak memory
    is one full copy of the weights per rank, as during generation. Plain modules pass through.
    """
    from rlctl.workers.parallel.expert_parallel import whole_experts

    units = fsdp_units(model)
    if not units:
        yield
        return
    with _unsharded(model, units), whole_experts(model):
        yield


def copy_weights(dst: torch.nn.Module, src: torch.nn.Module) -> None:
    """dst's parameters := src's, cast to dst's dtype (the same names in the same order; every rank
    calls). Both FSDP-sharded over the same ranks, each rank copies its shards; a bank of src's
    experts split by expert parallelism is all-gathered whole over its expert group and each rank
    keeps dst's shard of it (dst unsplit: the reference)."""
    from torch.distributed.tensor import distribute_tensor

    from rlctl.workers.parallel.expert_parallel import whole_parameter

    modules = dict(src.named_modules())
    with torch.no_grad():
        for (name, target), (other, param) in zip(dst.named_parameters(), src.named_parameters(), strict=True):
            if name != other:
                raise ConfigError(f"the two models' parameters differ ({name} vs {other})")
            value = whole_parameter(modules, name, param).to(target.dtype)
            if hasattr(target, "device_mesh") and not hasattr(value, "device_mesh"):   # a whole bank: dst's shard
                value = distribute_tensor(value, target.device_mesh, target.placements, src_data_rank=None)
            target.copy_(value)


@contextlib.contextmanager
def _unsharded(model: torch.nn.Module, units: list) -> Iterator[None]:
    # FSDP2 has no getter for reshard_after_forward; keep each group's setting to restore it.
    saved = [(g, g.post_forward_mesh_info) for u in units for g in u._get_fsdp_state()._fsdp_param_groups]
    try:
        for unit in units:
            unit.unshard()
        for unit in units:
            unit.set_reshard_after_forward(False, recurse=False)
        yield
    finally:
        for group, info in saved:
            group.post_forward_mesh_info = info
        for unit in units:
            unit.reshard()


def total_grad_norm(params: list[torch.nn.Parameter], max_norm: float, *, extra: list[torch.nn.Parameter] = (),
                    extra_sq: float = 0.0) -> float:
    """Global L2 norm of the gradients (over all ranks' shards), clipped to max_norm when > 0.

    clip_grad_norm_ works on DTensor shards: the norm it returns is itself a DTensor whose
    full_tensor() is the norm of the whole model's gradient, the same on every rank. `extra`
    parameters (plain local tensors: expert-parallel banks) add `extra_sq`, their global sum of
    squares, to the norm and are clipped by the same factor.
    """
    grads = [p for p in params if p.grad is not None]
    if extra:
        return _norm_with_extra(grads, list(extra), max_norm, extra_sq)
    if not grads:
        return 0.0
    norm = torch.nn.utils.clip_grad_norm_(grads, max_norm if max_norm > 0 else float("inf"))
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return float(norm)


def _norm_with_extra(params: list[torch.nn.Parameter], extra: list[torch.nn.Parameter], max_norm: float,
                     extra_sq: float) -> float:
    """total = sqrt(|dense|^2 + extra_sq); every gradient scaled by min(1, max_norm / (total + 1e-6)),
    clip_grad_norm_'s factor."""
    dense = torch.nn.utils.get_total_norm([p.grad for p in params]) if params else torch.tensor(0.0)
    if hasattr(dense, "full_tensor"):
        dense = dense.full_tensor()
    total = math.sqrt(float(dense) ** 2 + extra_sq)
    coef = max_norm / (total + 1e-6)
    if max_norm > 0 and coef < 1.0:
        for p in params + extra:
            if p.grad is not None:
                p.grad.mul_(coef)
    return total
