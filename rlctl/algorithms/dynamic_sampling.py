"""DAPO dynamic sampling: keep only groups whose reward varies.

A group whose samples all score the same gets zero advantage under any group baseline and only
dilutes the batch; DAPO drops such groups and generates more prompts until the batch is full.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

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


def filter_groups(group_ids, metric) -> GroupFilter:
    """Keep the groups whose per-sequence `metric` [B] has nonzero spread (population std > 0).

    As in verl's DAPO trainer, a group of one is always kept (it has no spread to measure) and a
    larger group whose metric holds NaN is dropped (NaN > 0 is false).
    """
    values = np.asarray(metric.tolist() if hasattr(metric, "tolist") else metric, dtype=np.float64)
    if values.ndim != 1 or len(values) != len(group_ids):
        raise AlgorithmError(f"metric must hold one number per sequence ({len(group_ids)}), got shape {values.shape}")
    ids = group_ids.tolist() if hasattr(group_ids, "tolist") else list(group_ids)
    index, n_groups = group_index(ids)
    index = index.numpy()
    id_of: dict = {}                                  # dense group -> its id, first-seen order
    for g, gid in zip(index.tolist(), ids):
        id_of.setdefault(g, gid)
    keep_group = np.zeros(n_groups, dtype=bool)
    for g in range(n_groups):
        members = values[index == g]
        keep_group[g] = len(members) == 1 or bool(np.std(members) > 0)
    kept = tuple(id_of[g] for g in range(n_groups) if keep_group[g])
    dropped = tuple(id_of[g] for g in range(n_groups) if not keep_group[g])
    return GroupFilter(keep=keep_group[index], kept_groups=kept, dropped_groups=dropped)
