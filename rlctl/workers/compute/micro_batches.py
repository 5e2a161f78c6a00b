"""Token-budget micro-batches: how a worker cuts its rows into forward/backward passes.

One planner for SFT (sft.micro_batch_max_tokens) and the RL passes (actor/critic.micro_batch_max_tokens).
A micro-batch's cost is what its forward runs on:
    padded=True   rows x longest row: the trimmed layout pads every row to the longest; rows are
                  sorted by length first, so rows of a micro-batch pad little
    padded=False  the sum of the rows' lengths: packed and shared-prompt layouts run no padding
                  (shared-prompt runs each prompt once, so it costs at most this); rows keep their
                  order, so a prompt's samples stay together for the shared-prompt layout
Micro-batches only change how a mini-batch's rows are grouped: the losses are normalised by counts
of the whole mini-batch (rlctl.workers.compute.training.minibatch_norm), so the loss and gradients are those
of fixed-row micro-batches up to float rounding.
"""

from __future__ import annotations

import numpy as np

from rlctl.workers.parallel import fsdp


def plan_micro_batches(lengths: np.ndarray, *, max_tokens: int, max_rows: int, count: int | None = None,
                       padded: bool = True) -> list[list[int]]:
    """Row indices of each micro-batch, cut greedily so that each costs <= max_tokens (0: max_rows
    rows each; a row over the budget goes alone). With `count` (the largest count over the ranks:
    each rank must run as many forward/backward passes, or FSDP's collectives hang), the costliest
    micro-batches are halved until there are `count`."""
    lengths = np.asarray(lengths, dtype=np.int64)
    order = np.argsort(lengths, kind="stable") if padded else np.arange(len(lengths))

    def cost(rows: list[int]) -> int:
        return len(rows) * int(lengths[rows].max()) if padded else int(lengths[rows].sum())

    groups: list[list[int]] = []
    for i in order.tolist():
        cur = groups[-1] if groups else None
        fits = cur is not None and (cost(cur + [i]) <= max_tokens if max_tokens else len(cur) < max_rows)
        if fits:
            cur.append(i)
        else:
            groups.append([i])
    while count is not None and len(groups) < count:
        splittable = [g for g in range(len(groups)) if len(groups[g]) > 1]
        if not splittable:
            raise ValueError(f"cannot cut {len(lengths)} rows into {count} micro-batches")
        k = max(splittable, key=lambda g: (cost(groups[g]), len(groups[g])))
        half = len(groups[k]) // 2
        groups[k:k + 1] = [groups[k][:half], groups[k][half:]]
    return groups


def synced_plan(lengths: np.ndarray, *, max_tokens: int, max_rows: int, padded: bool = True) -> list[list[int]]:
    """plan_micro_batches with as many micro-batches on every rank (the largest count over the
    ranks): the training passes, whose sharded forward and backward meet in collectives."""
    local = len(plan_micro_batches(lengths, max_tokens=max_tokens, max_rows=max_rows, padded=padded))
    count = int(fsdp.all_reduce_max(float(local)))
    return plan_micro_batches(lengths, max_tokens=max_tokens, max_rows=max_rows, count=count, padded=padded)
