"""PF-PPO (Shen et al. 2024, arXiv 2409.06957): policy filtration by resampling on the score.

A reward model is least reliable in the middle of its range, so PF-PPO trains on the samples whose
scores it trusts more. Each sample i gets a weight from its raw score s_i (before any KL penalty),
verl's three rules:
    pow:        w_i = |s_i|^p                          (p = weight_pow)
    max_min:    w_i = 1 for the group's highest and lowest score, else 0   (the paper's best-worst)
    max_random: w_i = 0.4 for the group's highest score, else 0.1         (the paper's best-random)
then each group (prompt) is resampled to its own size with replacement, P(i) = w_i / sum_g w, after
advantages are computed. verl takes max / min over the whole batch; rlctl does it per prompt, as the
paper's filters pick each prompt's best and worst responses, and so every prompt keeps its n rows
(a batch-wide max_min would train on copies of two samples). A group whose weights are all 0 (pow
with all-zero scores) keeps its rows as they are.
"""

from __future__ import annotations

import numpy as np

from .functional import group_index
from .registry import AlgorithmError

REWEIGHT_METHODS = ("pow", "max_min", "max_random")


def pf_ppo_weights(scores: np.ndarray, method: str, weight_pow: float = 2.0) -> np.ndarray:
    """The resampling weights [B] of one group's scores [B] (see the module docstring)."""
    scores = np.asarray(scores, dtype=np.float64)
    if method == "pow":
        return np.abs(scores) ** weight_pow
    if method == "max_min":
        return ((scores == scores.max()) | (scores == scores.min())).astype(np.float64)
    if method == "max_random":
        return np.where(scores == scores.max(), 0.4, 0.1)
    raise AlgorithmError(f"unknown PF-PPO reweight_method {method!r}: use one of {', '.join(REWEIGHT_METHODS)}")


def pf_ppo_resample(scores: np.ndarray, group_ids, method: str, weight_pow: float,
                    rng: np.random.Generator) -> np.ndarray:
    """Row indices [B] to take: each group's rows resampled to the group's size with replacement by
    their weights, in place of the group's own rows (so row i's replacement has row i's group)."""
    scores = np.asarray(scores, dtype=np.float64)
    if len(group_ids) != len(scores):
        raise AlgorithmError(f"group_ids has {len(group_ids)} entries but scores has {len(scores)}")
    index, n_groups = group_index(group_ids)
    index = index.numpy()
    out = np.arange(len(scores))
    for g in range(n_groups):
        rows = np.flatnonzero(index == g)
        weights = pf_ppo_weights(scores[rows], method, weight_pow)
        if weights.sum() > 0:
            out[rows] = rng.choice(rows, size=len(rows), replace=True, p=weights / weights.sum())
    return out
