"""Groups are episodes: compute_advantages(..., episode_ids=...) counts each agent episode once in its
group however many rows it became (split), and counts an episode that made no model call (no valid token,
its score on its first position). Hand-computed cases from the issue, a per-episode computation of every
scalar group estimator, and for every estimator: a split episode trains exactly as its rows merged into one."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlctl.algorithms import compute_advantages, estimator_names, filter_groups, scores_to_token_rewards

T = 5


def adv_of(name, rewards, mask, groups, episodes=None, **kw):
    adv, _ = compute_advantages(name, token_level_rewards=torch.tensor(rewards, dtype=torch.float64),
                                response_mask=torch.tensor(mask), group_ids=groups, episode_ids=episodes, **kw)
    return adv.numpy()


def test_a_split_episode_counts_once_in_grpo():
    # two episodes rewarded 1 and 0; the second became 3 rows; the outcome sits on each episode's last row
    mask = np.array([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 0]], bool)
    rewards = np.zeros((4, 3))
    rewards[0, 1] = 1.0
    adv = adv_of("grpo", rewards, mask, ["p"] * 4, [0, 1, 1, 1])
    assert np.allclose(adv[mask][:2], 1 / math.sqrt(2), atol=1e-5)          # every token of episode 0
    assert np.allclose(adv[1:][mask[1:]], -1 / math.sqrt(2), atol=1e-5)     # every token of every row of episode 1


def test_a_no_call_episodes_reward_counts_in_its_group():
    # (1, 1, 0, 0): the 1s made no model call (no token, the reward on the first position)
    mask = np.array([[0, 0], [0, 0], [1, 1], [1, 0]], bool)
    rewards = scores_to_token_rewards(torch.tensor([1.0, 1.0, 0.0, 0.0]), torch.tensor(mask)).double().numpy()
    adv = adv_of("grpo", rewards, mask, ["p"] * 4, [0, 1, 2, 3])
    assert np.allclose(adv[mask], -0.5 / math.sqrt(1 / 3), atol=1e-5)       # -0.866 on every calling token
    assert not adv[~mask].any()
    assert not adv_of("grpo", rewards, mask, ["p"] * 4).any()               # rows alone: nothing to learn


def test_rloo_never_puts_an_episodes_own_reward_in_its_baseline():
    # episode 0 (reward 2) split in 2 rows, episode 1 (reward 0), episode 2 (reward 1)
    mask = np.array([[1, 0], [1, 1], [1, 0], [1, 1]], bool)
    rewards = np.zeros((4, 2))
    rewards[1, 1], rewards[3, 1] = 2.0, 1.0
    adv = adv_of("rloo", rewards, mask, ["p"] * 4, [0, 0, 1, 2])
    assert np.allclose(adv[0, 0], 2 - (0 + 1) / 2) and np.allclose(adv[1], 2 - 0.5)
    assert np.allclose(adv[2, 0], 0 - 1.5) and np.allclose(adv[3], 1 - 1.0)


def test_single_row_episodes_give_bitwise_the_advantages_of_rows():
    rng = np.random.default_rng(0)
    mask = np.arange(T)[None, :] < rng.integers(1, T + 1, size=(8, 1))
    rewards = np.where(mask, rng.normal(size=(8, T)), 0.0)
    groups = [f"g{i // 4}" for i in range(8)]
    for name in ("grpo", "rloo", "gpg", "opo", "reinforce_plus_plus_baseline"):
        assert np.array_equal(adv_of(name, rewards, mask, groups, list(range(8))), adv_of(name, rewards, mask, groups))


# --- every estimator: a random batch of split, merged and no-call episodes, rows shuffled, padding rows -----

def episodes_case(seed: int):
    """Rows of 3 groups x 4 episodes (0 rows of tokens: no call; 1: merged; 2-3: split), shuffled, plus 2
    padding rows; each token a small reward (KL in the reward) and each episode's outcome on its last row."""
    rng = np.random.default_rng(seed)
    rows, spec = [], []                       # rows: (episode, group, mask [T], rewards [T]); spec: per episode
    for e in range(12):
        n_rows = (0, 3)[e] if e < 2 else int(rng.choice([0, 1, 2, 3], p=[0.2, 0.3, 0.3, 0.2]))   # one of each
        outcome = float(rng.integers(0, 3))
        parts = []
        for _ in range(max(n_rows, 1)):
            m = np.arange(T) < (rng.integers(1, T + 1) if n_rows else 0)
            parts.append([m, np.where(m, rng.normal(size=T).round(2) * 0.1, 0.0)])
        if n_rows:
            last = np.flatnonzero(parts[-1][0])[-1]
            parts[-1][1][last] += outcome
        else:
            parts[0][1][0] = outcome
        rows += [(e, f"g{e // 4}", m, r) for m, r in parts]
        spec.append((sum(r[m].sum() for m, r in parts) + (0.0 if n_rows else outcome),
                     sum(int(m.sum()) for m, _ in parts)))
    order = rng.permutation(len(rows))
    rows = [rows[i] for i in order] + [(-1, f"pad{i}", np.zeros(T, bool), np.full(T, np.nan)) for i in range(2)]
    return rows, spec, rng


def columns(rows, rng):
    """Per-token inputs (values, log-probs, PRM scores) and per-episode ones (baseline, reward component)."""
    b = len(rows)
    per_episode = rng.normal(size=12)
    return {"values": torch.tensor(rng.normal(size=(b, T))), "rm_scores": torch.tensor(rng.normal(size=(b, T))),
            "old_log_prob": torch.tensor(-rng.uniform(0.1, 2.0, size=(b, T))),
            "sum_pi_squared": torch.tensor(rng.uniform(0.1, 0.9, size=(b, T))),
            "reward_baselines": torch.tensor([per_episode[e] if e >= 0 else 0.0 for e, *_ in rows]),
            "reward_components": {"a": torch.tensor([per_episode[e] * 2 if e >= 0 else 0.0 for e, *_ in rows])}}


KW = {"gdpo": {"params": {"reward_keys": ["a"]}}}


def merged(rows, cols):
    """The same episodes as one row each: its rows' [T] parts one after another, in batch order (by hand)."""
    episodes = list(dict.fromkeys(e for e, *_ in rows if e >= 0))
    parts = {e: [i for i, (ee, *_) in enumerate(rows) if ee == e] for e in episodes}
    k = max(len(p) for p in parts.values())

    def cat(x):
        x = torch.as_tensor(x)
        if x.dim() == 2:
            return torch.stack([torch.cat([x[i] for i in parts[e]] + [x.new_zeros(T)] * (k - len(parts[e])))
                                for e in episodes])
        return torch.stack([x[parts[e][0]] for e in episodes])

    mask = cat(np.stack([m for _, _, m, _ in rows]))
    rewards = cat(np.nan_to_num(np.stack([r for *_, r in rows])))
    out = {c: (cat(v) if c != "reward_components" else {n: cat(x) for n, x in v.items()}) for c, v in cols.items()}
    groups = [next(g for ee, g, *_ in rows if ee == e) for e in episodes]
    return mask, rewards, out, groups, episodes, parts


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("name", [n for n in estimator_names() if n != "spin"])   # spin pairs data rows
def test_a_split_episode_trains_exactly_as_its_rows_merged_into_one(name, seed):
    rows, _, rng = episodes_case(seed)
    cols = columns(rows, rng)
    mask = torch.tensor(np.stack([m for _, _, m, _ in rows]))
    rewards = torch.tensor(np.stack([r for *_, r in rows]))
    groups, episodes = [g for _, g, *_ in rows], [e for e, *_ in rows]
    adv, ret = compute_advantages(name, token_level_rewards=rewards, response_mask=mask, group_ids=groups,
                                  episode_ids=episodes, **cols, **KW.get(name, {}))
    m_mask, m_rewards, m_cols, m_groups, order, parts = merged(rows, cols)
    m_adv, m_ret = compute_advantages(name, token_level_rewards=m_rewards, response_mask=m_mask, group_ids=m_groups,
                                      episode_ids=list(range(len(order))), **m_cols, **KW.get(name, {}))
    for j, e in enumerate(order):
        for s, i in enumerate(parts[e]):
            torch.testing.assert_close(adv[i], m_adv[j, s * T:(s + 1) * T], rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(ret[i], m_ret[j, s * T:(s + 1) * T], rtol=1e-6, atol=1e-6)
    assert torch.isfinite(adv).all() and not adv[-2:].any() and not adv[~mask].any()


def whiten(values: list[float]) -> tuple[float, float]:
    mean = sum(values) / len(values)
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) + 1e-8)


def by_hand(name: str, spec, norm: bool = True) -> list[float]:
    """Each episode's advantage from its score R (outcome + every token's reward) and its trained tokens,
    written per episode from the estimators' formulas; whitening over the tokens every episode trains."""
    eps, groups = 1e-6, [list(range(g * 4, g * 4 + 4)) for g in range(3)]
    score, length = [s for s, _ in spec], [n for _, n in spec]
    out = [0.0] * len(spec)
    for idx in groups:
        r = [score[i] for i in idx]
        mean, std = sum(r) / 4, math.sqrt(sum((x - sum(r) / 4) ** 2 for x in r) / 3)
        for i in idx:
            others = [score[j] for j in idx if j != i]
            out[i] = {"grpo": (score[i] - mean) / (std + eps) if norm else score[i] - mean,
                      "rloo": score[i] - sum(others) / 3,
                      "reinforce_plus_plus_baseline": score[i] - mean, "gdpo": (score[i] - mean) / (std + eps),
                      "gpg": (score[i] - mean) * len(score) / max(1, sum(s != 0 for s in score)),
                      "opo": score[i] - sum(length[j] * score[j] for j in idx) / max(sum(length[j] for j in idx),
                                                                                     1e-30),
                      "sppo": sum(1 / (1 + math.exp(score[j] - score[i])) for j in idx) / 4 - 0.5,
                      "grpo_passk": 0.0}[name]
        if name == "grpo_passk":
            top = sorted(idx, key=lambda i: -score[i])
            gap = score[top[0]] - score[top[1]]
            out[top[0]] = gap / (std + eps) if norm else gap
    if name in ("reinforce_plus_plus_baseline", "gdpo"):
        mean, scale = whiten([out[i] for i in range(len(spec)) for _ in range(length[i])])
        out = [(a - mean) / scale for a in out]
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("name, norm", [("grpo", True), ("grpo", False), ("rloo", True), ("gpg", True),
                                        ("opo", True), ("reinforce_plus_plus_baseline", True), ("gdpo", True),
                                        ("sppo", True), ("grpo_passk", True), ("grpo_passk", False)])
def test_each_group_estimator_per_episode_by_hand(name, norm, seed):
    rows, spec, _ = episodes_case(seed)
    mask = np.stack([m for _, _, m, _ in rows])
    adv = adv_of(name, np.stack([r for *_, r in rows]), mask, [g for _, g, *_ in rows], [e for e, *_ in rows],
                 norm_adv_by_std=norm)
    want = by_hand(name, spec, norm)
    for i, (e, _, m, _) in enumerate(rows):
        if e >= 0:
            np.testing.assert_allclose(adv[i][m], want[e], rtol=1e-6, atol=1e-6)


def test_dynamic_sampling_filters_groups_by_their_episodes():
    # group a: episodes 1 (one row) and 0 (three rows) -> varies; b: one episode of 2 rows scoring 1 and one
    # scoring 1 -> no spread; band: a's episode mean is 0.5 (rows would say 0.25)
    ids, metric = ["a"] * 4 + ["b"] * 3, [1, 0, 0, 0, 1, 1, 1]
    episodes = [0, 1, 1, 1, 2, 2, 3]
    kept = filter_groups(ids, metric, episode_ids=episodes)
    assert kept.kept_groups == ("a",) and kept.dropped_groups == ("b",)
    band = filter_groups(ids, metric, band=(0.4, 0.6), episode_ids=episodes)
    assert band.kept_groups == ("a",)
    assert filter_groups(ids, metric, band=(0.4, 0.6)).kept_groups == ()   # rows: 0.25
