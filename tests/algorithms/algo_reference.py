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
    """Discounted return-to-go over each row's valid tokens; a masked token is skipped (not a step)."""
    returns = np.zeros(rewards.shape)
    for i in range(rewards.shape[0]):
        running = 0.0
        for t in reversed(range(rewards.shape[1])):
            if not mask[i, t]:
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


# --- policy losses: one token at a time in plain Python, on each row's valid tokens only ---------

def agg(rows: list[list[float]], mode: str, horizon: int) -> float:
    """verl's agg_loss on compacted rows (rows with no token are not sequences)."""
    rows = [r for r in rows if r]
    if not rows:
        return 0.0
    if mode == "token-mean":
        return sum(sum(r) for r in rows) / sum(len(r) for r in rows)
    if mode == "seq-mean-token-mean":
        return sum(sum(r) / len(r) for r in rows) / len(rows)
    total = sum(sum(r) for r in rows) / len(rows)
    return total / horizon if mode == "seq-mean-token-sum-norm" else total


def _tokens(old, new, adv, mask):
    """Per row, the (old, new, A) triples of its valid tokens."""
    return [list(zip(o, n, a)) for o, n, a in zip(compact(old, mask), compact(new, mask), compact(adv, mask))]


def _mean(values):
    return sum(values) / len(values) if values else 0.0


def _ratio(o, n):
    return math.exp(max(-20.0, min(20.0, n - o)))


def sapo(old, new, adv, mask, tau_pos=1.0, tau_neg=1.05):
    rows = []
    for row in _tokens(old, new, adv, mask):
        out = []
        for o, n, a in row:
            tau = tau_pos if a > 0 else tau_neg
            gate = 4.0 / tau / (1.0 + math.exp(-tau * (_ratio(o, n) - 1.0)))
            out.append(-gate * a)
        rows.append(out)
    flat = [o - n for row in _tokens(old, new, adv, mask) for o, n, _ in row]
    return agg(rows, "seq-mean-token-mean", mask.shape[1]), {"ppo_kl": _mean(flat)}


def cispo(old, new, adv, mask, low, high, mode):
    rows, clipped = [], []
    for row in _tokens(old, new, adv, mask):
        out = []
        for o, n, a in row:
            r = _ratio(o, n)
            w = min(max(r, 1 - low), 1 + high)
            clipped.append(float(w != r))
            out.append(-w * a * n)
        rows.append(out)
    return agg(rows, mode, mask.shape[1]), {"pg_clipfrac": _mean(clipped)}


def geo_mean(old, new, adv, mask, low, high):
    losses, upper, lower = [], [], []
    for row in _tokens(old, new, adv, mask):
        total, adv_sum = 0.0, 0.0
        for o, n, a in row:
            d = n - o
            c = min(max(d, -low), high)
            # pessimistic: for A > 0 the smaller log-ratio, for A < 0 the larger, for A = 0 nothing
            total += min(d, c) if a > 0 else (max(d, c) if a < 0 else 0.0)
            adv_sum += a
            upper.append(float(d != c and a > 0))
            lower.append(float(d != c and a < 0))
        length = len(row) + 1e-8
        losses.append(-(adv_sum / length) * math.exp(total / length))
    return sum(losses) / len(losses), {"pg_clipfrac": _mean(upper), "pg_clipfrac_lower": _mean(lower)}


def _covariances(new, adv, mask):
    """(row, col, cov) of every valid token, row-major, cov = (A - mean A)(logp - mean logp)."""
    cells = [(i, j) for i in range(mask.shape[0]) for j in range(mask.shape[1]) if mask[i, j]]
    mean_a = _mean([adv[i, j] for i, j in cells])
    mean_l = _mean([new[i, j] for i, j in cells])
    return [(i, j, (adv[i, j] - mean_a) * (new[i, j] - mean_l)) for i, j in cells]


def kl_cov(old, new, adv, mask, mode, ratio=0.0002, coef=0.1):
    covs = _covariances(new, adv, mask)
    k = max(1, int(len(covs) * ratio))
    top = {(i, j) for i, j, _ in sorted(covs, key=lambda c: -c[2])[:k]}
    rows = []
    for i in range(mask.shape[0]):
        rows.append([-adv[i, j] * math.exp(new[i, j] - old[i, j])
                     + (coef * abs(new[i, j] - old[i, j]) if (i, j) in top else 0.0)
                     for j in range(mask.shape[1]) if mask[i, j]])
    return agg(rows, mode, mask.shape[1])


def clip_cov_candidates(old, new, adv, mask, low, high, lb=1.0, ub=5.0):
    """Valid tokens the PPO clip leaves alone whose covariance lies strictly inside (lb, ub)."""
    out = []
    for i, j, c in _covariances(new, adv, mask):
        r = math.exp(new[i, j] - old[i, j])
        a = adv[i, j]
        if not -a * min(max(r, 1 - low), 1 + high) > -a * r and lb < c < ub:
            out.append((i, j))
    return out


def clip_cov(old, new, adv, mask, low, high, mode, detached):
    """PPO clipped loss with the tokens in `detached` contributing zero."""
    rows = []
    for i in range(mask.shape[0]):
        row = []
        for j in range(mask.shape[1]):
            if not mask[i, j]:
                continue
            r, a = math.exp(new[i, j] - old[i, j]), adv[i, j]
            row.append(0.0 if (i, j) in detached else max(-a * r, -a * min(max(r, 1 - low), 1 + high)))
        rows.append(row)
    return agg(rows, mode, mask.shape[1])


def gpg_loss(new, adv, mask, mode):
    return agg([[-n * a for n, a in zip(nr, ar)] for nr, ar in zip(compact(new, mask), compact(adv, mask))],
               mode, mask.shape[1])


def dppo(kind, old, new, adv, mask, low, high, c, mode):
    rows, masked, truncated = [], [], []
    for row in _tokens(old, new, adv, mask):
        out = []
        for o, n, a in row:
            p, q = math.exp(n), math.exp(o)
            if kind == "tv":
                inside = (p - q <= high) if a > 0 else (p - q >= -low)
            else:
                kl = q * (o - n) + (1 - q) * math.log((1 - q + 1e-8) / (1 - p + 1e-8))
                inside = (kl <= high or p <= q) if a > 0 else (kl <= low or p >= q)
            r = _ratio(o, n)
            out.append(-a * min(r, c) * n if inside else 0.0)
            masked.append(float(not inside))
            truncated.append(float(inside and r > c))
        rows.append(out)
    return agg(rows, mode, mask.shape[1]), {"pg_clipfrac": _mean(masked), "pg_clipfrac_lower": _mean(truncated)}


# --- group estimators (verl's grpo_passk, opo, gpg, gdpo, optimal_token_baseline) ------------------

def _std(values):
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def grpo_passk(rewards, mask, group_ids, norm_adv_by_std=True, eps=1e-6):
    scores = [sum(row) for row in compact(rewards, mask)]
    adv = [0.0] * len(scores)
    for idx in _groups(group_ids).values():
        ranked = sorted(idx, key=lambda i: -scores[i])
        gap = scores[ranked[0]] - scores[ranked[1]]
        adv[ranked[0]] = gap / (_std([scores[i] for i in idx]) + eps) if norm_adv_by_std else gap
    return np.array(adv)[:, None] * mask


def opo(rewards, mask, group_ids):
    scores = [sum(row) for row in compact(rewards, mask)]
    lengths = [float(m.sum()) for m in mask]
    adv = list(scores)
    for idx in _groups(group_ids).values():
        if len(idx) > 1:
            b = sum(lengths[i] * scores[i] for i in idx) / sum(lengths[i] for i in idx)
            for i in idx:
                adv[i] = scores[i] - b
    return np.array(adv)[:, None] * mask


def gpg(rewards, mask, group_ids):
    scores = [sum(row) for row in compact(rewards, mask)]
    alpha = len(scores) / max(1, sum(1 for s in scores if s != 0))
    adv = [alpha * s for s in scores]
    for idx in _groups(group_ids).values():
        if len(idx) > 1:
            mean = sum(scores[i] for i in idx) / len(idx)
            for i in idx:
                adv[i] = alpha * (scores[i] - mean)
    return np.array(adv)[:, None] * mask


def gdpo(components, weights, mask, group_ids, eps=1e-6):
    """Per component: GRPO within groups; mix with weights; whiten over valid tokens."""
    mixed = [0.0] * mask.shape[0]
    for w, comp in zip(weights, components):
        for idx in _groups(group_ids).values():
            group = [comp[i] for i in idx]
            mean = sum(group) / len(group) if len(group) > 1 else 0.0
            std = _std(group) if len(group) > 1 else 1.0
            for i in idx:
                mixed[i] += w * (comp[i] - mean) / (std + eps)
    rows = [[mixed[i]] * int(mask[i].sum()) for i in range(mask.shape[0])]
    return expand(whiten(rows), mask)


def optimal_token_baseline(rewards, mask, group_ids, old_log_prob, sum_pi_squared, is_weights=None):
    """B_t = sum_i G_it W_it / (sum_i W_it + 1e-8) over the group's rows still valid at t."""
    b, t = mask.shape
    togo = np.zeros((b, t))
    cum_w = np.zeros((b, t))
    for i in range(b):
        run = 0.0
        for j in reversed(range(t)):
            run += rewards[i, j] if mask[i, j] else 0.0
            togo[i, j] = run
        acc = 0.0
        for j in range(t):
            if mask[i, j]:
                w = 1 - 2 * math.exp(old_log_prob[i, j]) + sum_pi_squared[i, j]
                acc += w * (is_weights[i, j] ** 2 if is_weights is not None else 1.0)
            cum_w[i, j] = acc
    adv = np.zeros((b, t))
    for idx in _groups(group_ids).values():
        for j in range(t):
            rows = [i for i in idx if mask[i, j]]
            base = (sum(togo[i, j] * cum_w[i, j] for i in rows) / (sum(cum_w[i, j] for i in rows) + 1e-8)
                    if len(idx) > 1 else 0.0)
            for i in rows:
                adv[i, j] = togo[i, j] - base
    return adv, togo * mask


# --- rollout correction (verl's rollout_corr_helper), one row at a time ---------------------------

def rollout_is(old, rollout, mask, level, threshold):
    """(truncated weights [B, T], metrics): raw w = exp(clamp(lr)) per token or exp(clamp(sum lr)) per row."""
    b, t = mask.shape
    raw = np.zeros((b, t))
    seq_logs = []
    for i in range(b):
        lrs = [old[i, j] - rollout[i, j] for j in range(t) if mask[i, j]]
        seq_logs.append(sum(lrs))
        for j in range(t):
            if mask[i, j]:
                lr = old[i, j] - rollout[i, j] if level == "token" else sum(lrs)
                raw[i, j] = math.exp(max(-20.0, min(20.0, lr)))
    vals = [raw[i, j] for i in range(b) for j in range(t) if mask[i, j]]
    m = {"rollout_is_mean": sum(vals) / len(vals)}
    if level == "token":
        m.update(rollout_is_max=max(vals), rollout_is_min=min(vals),
                 rollout_is_ratio_fraction_high=_mean([float(v > threshold) for v in vals]),
                 rollout_is_ratio_fraction_low=_mean([float(v < 1 / threshold) for v in vals]))
    else:
        m.update(rollout_is_max=math.exp(min(max(seq_logs), 20.0)), rollout_is_min=math.exp(min(seq_logs)),
                 rollout_is_ratio_fraction_high=_mean([float(s > math.log(threshold)) for s in seq_logs]),
                 rollout_is_ratio_fraction_low=_mean([float(s < math.log(1 / threshold)) for s in seq_logs]))
    bounded = [min(max(v, 1 / threshold), threshold) for v in vals]
    mb = _mean(bounded)
    m["rollout_is_eff_sample_size"] = 1.0 / _mean([(v / (mb + 1e-8)) ** 2 for v in bounded])
    return np.minimum(raw, threshold), m


def rollout_rs(old, rollout, mask, option, lower, upper):
    """Keep mask [B, T] for one rejection option (k1 bounds are ratios, compared in log space)."""
    b, t = mask.shape
    keep = np.ones((b, t))
    level, kind = option.rsplit("_", 1)
    for i in range(b):
        lrs = [max(-20.0, min(20.0, old[i, j] - rollout[i, j])) for j in range(t) if mask[i, j]]
        stats = [-x if kind == "k1" else (0.5 * x * x if kind == "k2" else math.exp(x) - 1 - x) for x in lrs]
        if level == "token":
            ok = [(math.log(lower) <= s <= math.log(upper)) if kind == "k1" else s <= upper for s in stats]
            for j, o in zip(np.flatnonzero(mask[i]), ok):
                keep[i, j] = float(o)
            continue
        s = sum(stats) if level == "seq_sum" else (_mean(stats) if level == "seq_mean" else max(stats))
        ok = (math.log(lower) <= s <= math.log(upper)) if kind == "k1" else s <= upper
        keep[i, :] = float(ok)
    return keep


def dro(old, new, adv, mask, beta, mode):
    """verl's compute_policy_loss_dro: -(A log pi - beta/2 (log pi - log pi_old)^2), ppo_kl = mean(old - new)."""
    rows = [[-(n * a - 0.5 * beta * (n - o) ** 2) for o, n, a in row] for row in _tokens(old, new, adv, mask)]
    return agg(rows, mode, mask.shape[1]), {"ppo_kl": _mean([o - n for row in _tokens(old, new, adv, mask)
                                                             for o, n, _ in row])}
