"""How a worker method's arguments are spread over a group's ranks, declared where it is defined.

    class ActorRolloutRefWorker:
        @register(Dispatch.DP)
        def compute_log_prob(self, batch: Batch) -> Batch: ...

The controller calls `group.role("actor").compute_log_prob(batch)`: the group splits the batch,
sends every rank its part before waiting on any (ranks meet in collectives, so a call that
reached only some ranks would hang), and joins the results in input order.

This module imports only numpy, so worker modules can import `register` cheaply.
"""

from __future__ import annotations

import enum
from typing import Any, Callable

from rlctl.errors import ConfigError
from rlctl.runtime.batch import Batch


class Dispatch(enum.Enum):
    ALL = "all"            # same arguments to every rank; a list of results in rank order
    RANK0 = "rank0"        # same arguments to every rank (collectives); rank 0's result
    DP = "dp"              # Batch arguments split over ranks (sizes may differ by one row);
                           # Batch results concatenated in input order, others as a list
    DP_TRAIN = "dp_train"  # Batch arguments split into equal parts, striped by mini-batch
                           # (see shard_batch); rank 0's result (the worker reduces metrics)


_ATTR = "_rlctl_dispatch"


def register(mode: Dispatch) -> Callable:
    """Mark a worker method as callable from the controller with dispatch `mode`."""
    if not isinstance(mode, Dispatch):
        raise TypeError(f"register() takes a Dispatch mode, got {mode!r}")

    def mark(fn: Callable) -> Callable:
        setattr(fn, _ATTR, mode)
        return fn

    return mark


def dispatch_mode(cls: type, method: str) -> Dispatch:
    """The mode `cls.method` was registered with; AttributeError if it is not a remote method."""
    fn = getattr(cls, method, None)
    mode = getattr(fn, _ATTR, None)
    if mode is None:
        raise AttributeError(f"{cls.__name__}.{method} is not a worker method (decorate it with @register)")
    return mode


def shard_batch(batch: Batch, world: int, *, even: bool, label: str) -> list[Batch]:
    """Split `batch` into `world` parts, one per rank, in rank order.

    When batch.meta["mini_batches"] = K > 1 (and even=True), the rows are K consecutive
    mini-batches and rank r gets the r-th part of each, so mini-batch k on the group is exactly
    rows [k*B/K, (k+1)*B/K) of the input: a W-rank group takes the same optimizer steps as 1 rank.
    """
    rows, blocks = len(batch), int(batch.meta.get("mini_batches", 1)) if even else 1
    if rows < world:
        raise ConfigError(f"{label}: a batch of {rows} rows cannot be split over {world} workers",
                          hint="use more prompts per step or fewer resources.workers")
    if even and rows % (world * blocks):
        raise ConfigError(f"{label}: {rows} rows in {blocks} mini-batch(es) do not split evenly over "
                          f"{world} workers",
                          hint="make data.batch_size x rollout.n (and each mini-batch) a multiple of the workers")
    if blocks == 1:
        return batch.chunk(world, even=even)
    per_block = [block.chunk(world, even=True) for block in batch.chunk(blocks, even=True)]
    return [Batch.concat([parts[rank] for parts in per_block]) for rank in range(world)]


def split_arguments(mode: Dispatch, world: int, args: tuple, kwargs: dict,
                    label: str) -> list[tuple[tuple, dict]]:
    """Per-rank (args, kwargs). DP modes split every Batch argument; others copy the arguments."""
    if mode in (Dispatch.ALL, Dispatch.RANK0):
        return [(args, kwargs)] * world
    even = mode is Dispatch.DP_TRAIN

    def parts(value: Any) -> list[Any]:
        return shard_batch(value, world, even=even, label=label) if isinstance(value, Batch) else [value] * world

    split_args = [parts(a) for a in args]
    split_kwargs = {k: parts(v) for k, v in kwargs.items()}
    return [(tuple(a[r] for a in split_args), {k: v[r] for k, v in split_kwargs.items()})
            for r in range(world)]


def collect_results(mode: Dispatch, results: list[Any]) -> Any:
    """Join per-rank results (rank order) the way `mode` promises."""
    if mode in (Dispatch.RANK0, Dispatch.DP_TRAIN):
        return results[0]
    if mode is Dispatch.DP and results and all(isinstance(r, Batch) for r in results):
        return Batch.concat(results)
    return list(results)
