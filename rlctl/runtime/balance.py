"""Token-balanced splits: a batch's rows reordered so every rank's part holds about the same tokens.

With a token budget (actor/critic.micro_batch_max_tokens), a rank's pass costs its tokens, and the
group waits for the slowest rank. The controller flags such a batch (`balanced`); the group then
reorders its rows before the usual split (rlctl.runtime.dispatch.shard_batch) and puts a DP call's
joined result back in input order, so the caller sees no difference:

    DP        rows to ranks as evenly as tokens allow, each rank as many rows as without balancing
    DP_TRAIN  the same within each mini-batch (meta["mini_batches"] blocks): every mini-batch keeps
              its rows, so the optimizer steps are the same up to float rounding

A prompt's samples (consecutive rows with one `uid`) go to one rank together where the ranks' row
counts allow it, so a rank still runs each of its prompts once (the shared-prompt layout); else
rows are placed one by one. Placement is greedy: the costliest unit first, each to the rank with
the fewest tokens so far that has room for it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlctl.runtime.batch import Batch, chunk_bounds
from rlctl.runtime.dispatch import Dispatch

BALANCE = "balance_tokens"   # Batch.meta flag, consumed by the group (workers never see it)


def balanced(batch: Batch, budget: int) -> Batch:
    """`batch` flagged for a token-balanced split when the role has a token budget (budget > 0),
    else unflagged (a batch built on an earlier flagged one may carry the flag): a new Batch
    sharing the arrays, or `batch` itself when it already is so."""
    if (budget > 0) == bool(batch.meta.get(BALANCE)):
        return batch
    meta = {k: v for k, v in batch.meta.items() if k != BALANCE}
    return Batch(batch.tensors, {**meta, BALANCE: True} if budget > 0 else meta)


def balance_rows(mode: Dispatch, world: int, args: tuple, kwargs: dict) -> tuple[tuple, dict, np.ndarray | None]:
    """A DP / DP_TRAIN call's flagged Batch arguments reordered (token_balanced_order) and unflagged.
    Returns (args, kwargs, inverse): `inverse` puts the joined DP result back in input order (None:
    nothing was reordered)."""
    flagged = [v for v in (*args, *kwargs.values()) if isinstance(v, Batch) and v.meta.get(BALANCE)]
    if not flagged:
        return args, kwargs, None
    first, order = flagged[0], None
    blocks = int(first.meta.get("mini_batches", 1)) if mode is Dispatch.DP_TRAIN else 1
    splits = len(first) >= world and (mode is Dispatch.DP or not len(first) % (world * blocks))
    if mode in (Dispatch.DP, Dispatch.DP_TRAIN) and splits:   # else shard_batch reports the bad split
        order = token_balanced_order(first["attention_mask"].sum(1), world, blocks=blocks, groups=first.get("uid"))

    def fix(value: Any) -> Any:
        if not (isinstance(value, Batch) and value.meta.get(BALANCE)):
            return value
        if order is not None and len(value) != len(first):
            raise ValueError(f"balanced Batch arguments of {len(first)} and {len(value)} rows")
        meta = {k: v for k, v in value.meta.items() if k != BALANCE}
        return Batch((value.select(order) if order is not None else value).tensors, meta)

    args, kwargs = tuple(fix(a) for a in args), {k: fix(v) for k, v in kwargs.items()}
    return args, kwargs, None if order is None else np.argsort(order)


def restore_order(result: Any, inverse: np.ndarray | None) -> Any:
    """A DP call's joined Batch result in the caller's row order (balance_rows' inverse)."""
    return result.select(inverse) if inverse is not None and isinstance(result, Batch) else result


def token_balanced_order(tokens: np.ndarray, world: int, *, blocks: int = 1,
                         groups: np.ndarray | None = None) -> np.ndarray:
    """A row order whose split over `world` ranks, `blocks` consecutive blocks each cut as
    Batch.chunk cuts (rank r: part r of every block), gives the ranks about equal tokens.
    tokens [B]: each row's tokens; groups [B] (optional): rows with one value that are
    consecutive stay on one rank where the row counts allow it."""
    tokens = np.asarray(tokens, dtype=np.int64)
    order: list[np.ndarray] = []
    edges = chunk_bounds(len(tokens), blocks)
    for lo, hi in zip(edges[:-1], edges[1:]):
        rows = np.arange(lo, hi)
        room = np.diff(chunk_bounds(hi - lo, world))
        rank = None
        if groups is not None:
            rank = _place(tokens[rows], room, _runs(np.asarray(groups)[rows]))
        if rank is None:
            rank = _place(tokens[rows], room, [np.array([i]) for i in range(len(rows))])
        order += [rows[rank == r] for r in range(world)]
    return np.concatenate(order) if order else np.arange(0)


def _runs(groups: np.ndarray) -> list[np.ndarray]:
    """Index runs of equal consecutive values."""
    if not len(groups):
        return []
    starts = [0] + [i for i in range(1, len(groups)) if groups[i] != groups[i - 1]] + [len(groups)]
    return [np.arange(a, b) for a, b in zip(starts[:-1], starts[1:])]


def _place(tokens: np.ndarray, room: np.ndarray, units: list[np.ndarray]) -> np.ndarray | None:
    """Each row's rank: units by tokens, most first, each to the least-loaded rank with room for all
    its rows; None when a unit fits on no rank."""
    load, room, rank = np.zeros(len(room)), room.copy(), np.empty(len(tokens), dtype=np.int64)
    for unit in sorted(units, key=lambda u: -int(tokens[u].sum())):
        fits = np.flatnonzero(room >= len(unit))
        if not len(fits):
            return None
        r = int(fits[np.argmin(load[fits])])
        rank[unit], load[r], room[r] = r, load[r] + tokens[unit].sum(), room[r] - len(unit)
    return rank
