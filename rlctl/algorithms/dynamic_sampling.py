"""DAPO dynamic sampling: keep only groups whose reward varies.

A group whose samples all score the same gets zero advantage under any group baseline and only
dilutes the batch; DAPO drops such groups and generates more prompts until the batch is full.
PRIME's recipe filters by a band of mean accuracy instead, and can drop groups with a response
cut at the length limit; both are options of the same filter.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .episodes import member_rows
from .functional import group_index
from .registry import AlgorithmError


@dataclass(frozen=True)
class GroupFilter:
    """keep: bool [B] per sequence; kept_groups / dropped_groups: group ids in first-seen order."""

    keep: np.ndarray
    kept_groups: tuple
    dropped_groups: tuple

    @property
    def num_kept(self) -> int:
        return len(self.kept_groups)

    @property
    def num_dropped(self) -> int:
        return len(self.dropped_groups)


def filter_groups(group_ids, metric, *, band: tuple[float, float] | None = None, truncated=None,
                  episode_ids=None) -> GroupFilter:
    """Keep the groups whose per-sequence `metric` [B] has nonzero spread (population std > 0).

    As in verl's DAPO trainer, a group of one is always kept (it has no spread to measure) and a
    larger group whose metric holds NaN is dropped (NaN > 0 is false).
    band = (lo, hi): keep instead the groups whose mean metric lies in [lo, hi], both ends
    included as in verl's PRIME recipe (a NaN mean is outside). truncated: bool [B]; a group with
    any truncated response is dropped as well (PRIME's filter_truncate). episode_ids [B]: rows with one id
    are one sample (an agent episode's rows, which share its metric): spread and mean are over episodes.
    """
    if band is not None and not band[0] <= band[1]:
        raise AlgorithmError(f"band must be (lo, hi) with lo <= hi, got {tuple(band)}")
    values = _per_sequence(metric, len(group_ids), "metric", np.float64)
    cut = _per_sequence(truncated, len(group_ids), "truncated", bool) if truncated is not None else None
    ids = group_ids.tolist() if hasattr(group_ids, "tolist") else list(group_ids)
    index, n_groups = group_index(ids)
    index = index.numpy()
    member = np.zeros(len(ids), dtype=bool)          # the rows that stand for the samples
    member[member_rows(ids, episode_ids)] = True
    id_of: dict = {}                                  # dense group -> its id, first-seen order
    for g, gid in zip(index.tolist(), ids):
        id_of.setdefault(g, gid)
    keep_group = np.zeros(n_groups, dtype=bool)
    for g in range(n_groups):
        members = values[(index == g) & member]
        if band is not None:
            keep_group[g] = bool(band[0] <= members.mean() <= band[1])
        else:
            keep_group[g] = len(members) == 1 or bool(np.std(members) > 0)
        if cut is not None and cut[index == g].any():
            keep_group[g] = False
    kept = tuple(id_of[g] for g in range(n_groups) if keep_group[g])
    dropped = tuple(id_of[g] for g in range(n_groups) if not keep_group[g])
    return GroupFilter(keep=keep_group[index], kept_groups=kept, dropped_groups=dropped)


def _per_sequence(values, size: int, name: str, dtype) -> np.ndarray:
    out = np.asarray(values.tolist() if hasattr(values, "tolist") else values, dtype=dtype)
    if out.ndim != 1 or len(out) != size:
        kind = "flag" if dtype is bool else "number"
        raise AlgorithmError(f"{name} must hold one {kind} per sequence ({size}), got shape {out.shape}")
    return out
