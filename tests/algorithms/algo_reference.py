"""Independent re-derivations of the estimators in plain numpy/Python, one sequence at a time.

Written from the papers' formulas (and verl's documented conventions for groups of one), not from
rlctl's vectorised code: each sequence is compacted to its valid tokens first, so masking is
handled by construction rather than by the recursion tricks the library uses.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np


def whiten(rows_of_values: list[list[float]]) -> list[list[float]]:
    flat = [v for row in rows_of_values for v in row]
    n = len(flat)
    if n == 0:
        return rows_of_values
    mean = sum(flat) / n
    var = sum((v - mean) ** 2 for v in flat) / (n - 1) if n > 1 else 0.0
    return [[(v - mean) / math.sqrt(var + 1e-8) for v in row] for row in rows_of_values]


def compact(matrix: np.ndarray, mask: np.ndarray) -> list[list[float]]:
    return [[float(x) for x, m in zip(row, mrow) if m] for row, mrow in zip(matrix, mask)]


def expand(rows: list[list[float]], mask: np.ndarray) -> np.ndarray:
    out = np.zeros(mask.shape)
    for i, row in enumerate(rows):
        out[i, np.flatnonzero(mask[i])] = row
    return out


def gae(rewards, values, mask, gamma, lam):
    """A_k = sum_l (gamma lam)^l delta_{k+l}, delta_k = r_k + gamma V_{k+1} - V_k over valid tokens."""
    raw = []
    for r, v in zip(compact(rewards, mask), compact(values, mask)):
        n = len(r)
        delta = [r[k] + gamma * (v[k + 1] if k + 1 < n else 0.0) - v[k] for k in range(n)]
        raw.append([sum((gamma * lam) ** l * delta[k + l] for l in range(n - k)) for k in range(n)])
    returns = [[a + vv for a, vv in zip(ar, vr)] for ar, vr in zip(raw, compact(values, mask))]
    return expand(whiten(raw), mask), expand(returns, mask)


def _groups(group_ids):
    members = defaultdict(list)
    for i, g in enumerate(group_ids):
        members[g].append(i)
    return members


def grpo(rewards, mask, group_ids, norm_adv_by_std=True, eps=1e-6):
    scores = [sum(row) for row in compact(rewards, mask)]
    adv = [0.0] * len(scores)
    for idx in _groups(group_ids).values():
        group = [scores[i] for i in idx]
        mean = sum(group) / len(group) if len(group) > 1 else 0.0
        std = math.sqrt(sum((s - mean) ** 2 for s in group) / (len(group) - 1)) if len(group) > 1 else 1.0
        for i in idx:
            adv[i] = (scores[i] - mean) / (std + eps) if norm_adv_by_std else scores[i] - mean
    return np.array(adv)[:, None] * mask


def rloo(rewards, mask, group_ids):
    scores = [sum(row) for row in compact(rewards, mask)]
    adv = list(scores)
    for idx in _groups(group_ids).values():
        for i in idx:
            others = [scores[j] for j in idx if j != i]
            if others:
                adv[i] = scores[i] - sum(others) / len(others)
    return np.array(adv)[:, None] * mask


def reinforce_plus_plus(rewards, mask, gamma):
    """Discounted return-to-go over each row's valid prefix block; a masked token resets it."""
    returns = np.zeros(rewards.shape)
    for i in range(rewards.shape[0]):
        running = 0.0
        for t in reversed(range(rewards.shape[1])):
            if not mask[i, t]:
                running = 0.0
                continue
            running = rewards[i, t] + gamma * running
            returns[i, t] = running
    return expand(whiten(compact(returns, mask)), mask), returns


def rf_baseline(rewards, mask, group_ids):
    scores = [sum(row) for row in compact(rewards, mask)]
    centred = list(scores)
    for idx in _groups(group_ids).values():
        if len(idx) > 1:
            mean = sum(scores[i] for i in idx) / len(idx)
            for i in idx:
                centred[i] = scores[i] - mean
    rows = [[centred[i]] * int(mask[i].sum()) for i in range(len(scores))]
    return expand(whiten(rows), mask)


def remax(rewards, mask, baselines):
    adv = np.zeros(rewards.shape)
    for i, row in enumerate(compact(rewards, mask)):
        togo = [sum(row[k:]) for k in range(len(row))]
        adv[i, np.flatnonzero(mask[i])] = [g - baselines[i] for g in togo]
    return adv
