"""Episodes as the samples of a group: the rows of one episode folded into one row, and back.

An agent episode whose calls did not all continue one another becomes several training rows (one per
sequence), and one that made no model call a row with nothing to train. A prompt's group is still its
rollout.n episodes, so `compute_advantages(..., episode_ids=...)` folds: each episode's rows, in batch
order, become one row of the estimator's batch, their [T] parts one after another ([E, K*T] for E
episodes of at most K rows); the estimator runs on the E episodes; each row gets back its own part of
its episode's advantages and returns. Every estimator thus counts an episode once in its group (GRPO's
mean and std, RLOO's leave-one-out, ...) without code of its own, and a split episode trains exactly
as it would have had its calls merged into one row (its outcome reward must sit on one of its rows).
Rows with a negative episode id are padding, no sample of any group: they get zeros.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .registry import AlgorithmError


@dataclass(frozen=True)
class EpisodeFold:
    """episode [B] long: each row's episode (dense, first-seen order; -1 on padding rows); slot [B] long:
    its place among its episode's rows; first [E] long: each episode's first row; slots: K, the most rows
    of one episode."""

    episode: torch.Tensor
    slot: torch.Tensor
    first: torch.Tensor
    slots: int

    @classmethod
    def of(cls, episode_ids, batch: int) -> "EpisodeFold":
        ids = episode_ids.tolist() if hasattr(episode_ids, "tolist") else list(episode_ids)
        if len(ids) != batch:
            raise AlgorithmError(f"episode_ids has {len(ids)} entries but the batch has {batch} sequences")
        dense: dict = {}
        episode, slot, rows_of, first = [], [], [], []
        for row, eid in enumerate(ids):
            if _padding(eid):
                episode.append(-1)
                slot.append(0)
                continue
            e = dense.setdefault(eid, len(dense))
            if e == len(rows_of):
                rows_of.append(0)
                first.append(row)
            episode.append(e)
            slot.append(rows_of[e])
            rows_of[e] += 1
        return cls(torch.tensor(episode, dtype=torch.long), torch.tensor(slot, dtype=torch.long),
                   torch.tensor(first, dtype=torch.long), max(rows_of, default=1))

    @property
    def count(self) -> int:
        return len(self.first)

    @property
    def identity(self) -> bool:
        """Every row its own episode, in order: folding would change nothing."""
        return self.count == len(self.episode) and bool((self.first == torch.arange(self.count)).all())

    def tokens(self, x: torch.Tensor) -> torch.Tensor:
        """[B, T, ...] -> [E, K*T, ...]: each episode's rows one after another (zeros where it has fewer)."""
        real = self.episode >= 0
        out = x.new_zeros((self.count, self.slots, *x.shape[1:]))
        out[self.episode[real].to(x.device), self.slot[real].to(x.device)] = x[real.to(x.device)]
        return out.reshape(self.count, self.slots * x.shape[1], *x.shape[2:])

    def rows(self, x, dim: int = 0):
        """A per-row value [B, ...] (or [..., B, ...] along `dim`) -> its episode's first row's: [E, ...]."""
        if isinstance(x, torch.Tensor):
            return x.index_select(dim, self.first.to(x.device))
        return [x[int(i)] for i in self.first]

    def unfold(self, y: torch.Tensor, width: int) -> torch.Tensor:
        """[E, K*T] -> [B, T]: each row's own part of its episode's row; zeros on padding rows."""
        parts = y.reshape(self.count, self.slots, width)
        real = self.episode >= 0
        out = y.new_zeros((len(self.episode), width))
        out[real.to(y.device)] = parts[self.episode[real].to(y.device), self.slot[real].to(y.device)]
        return out

    def check_groups(self, group_ids) -> None:
        """Every row of an episode must belong to its episode's group."""
        ids = group_ids.tolist() if hasattr(group_ids, "tolist") else list(group_ids)
        for row, e in enumerate(self.episode.tolist()):
            if e >= 0 and ids[row] != ids[int(self.first[e])]:
                raise AlgorithmError(f"row {row} of an episode has group id {ids[row]!r}, its episode's first row "
                                     f"{ids[int(self.first[e])]!r}: every row of an episode belongs to one group")


def _padding(eid) -> bool:
    try:
        return eid < 0
    except TypeError:   # a string or other hashable id is never padding
        return False


def member_rows(group_ids, episode_ids) -> list[int]:
    """The rows that stand for the samples of the groups: the first row of each episode (every row when
    episode_ids is None; a padding row stands for itself)."""
    if episode_ids is None:
        return list(range(len(group_ids)))
    fold = EpisodeFold.of(episode_ids, len(group_ids))
    pads = torch.nonzero(fold.episode < 0).squeeze(-1)
    return sorted(fold.first.tolist() + pads.tolist())
