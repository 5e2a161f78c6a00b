"""Hand-computed cases and edge cases for every advantage estimator (numbers derived on paper)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rlctl.algorithms import AlgorithmError, compute_advantages


def f64(x):
    return torch.tensor(x, dtype=torch.float64)


def close(actual, expected, tol=1e-6):
    torch.testing.assert_close(actual, f64(expected) if not isinstance(expected, torch.Tensor) else expected,
                               atol=tol, rtol=0, check_dtype=False)


def outcome(scores, mask):
    """Outcome rewards: each score on the row's last valid token."""
    mask = f64(mask)
    rewards = torch.zeros_like(mask)
    for i, s in enumerate(scores):
        valid = torch.nonzero(mask[i]).flatten()
        if len(valid):
            rewards[i, valid[-1]] = s
    return rewards, mask


# groups interleaved on purpose: rows of one group are not adjacent
IDS = ["a", "b", "a", "c", "b", "a"]
SCORES = [1.0, 2.0, 0.0, 5.0, 2.0, 0.0]      # a: 1, 0, 0   b: 2, 2   c: 5 (alone)
MASK = [[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1], [1, 1, 0]]


def per_seq(adv):
    return adv[:, 0]


def test_grpo_hand_case():
    rewards, mask = outcome(SCORES, MASK)
    adv, ret = compute_advantages("grpo", token_level_rewards=rewards, response_mask=mask, group_ids=IDS)
    # a: mean 1/3, unbiased std sqrt(1/3); b: std 0; c alone: mean 0, std 1 (verl) -> 5 / (1 + eps)
    s = math.sqrt(1 / 3) + 1e-6
    close(per_seq(adv), [(2 / 3) / s, 0.0, (-1 / 3) / s, 5 / (1 + 1e-6), 0.0, (-1 / 3) / s])
    close(adv, per_seq(adv)[:, None] * mask)            # broadcast over valid tokens only
    assert torch.equal(adv, ret)


def test_dr_grpo_hand_case():
    rewards, mask = outcome(SCORES, MASK)
    adv, _ = compute_advantages("grpo", token_level_rewards=rewards, response_mask=mask, group_ids=IDS,
                                norm_adv_by_std=False)
    close(per_seq(adv), [2 / 3, 0.0, -1 / 3, 5.0, 0.0, -1 / 3])


def test_rloo_hand_case():
    rewards, mask = outcome(SCORES, MASK)
    adv, ret = compute_advantages("rloo", token_level_rewards=rewards, response_mask=mask, group_ids=IDS)
    # a: 1 - (0+0)/2, 0 - (1+0)/2, 0 - (1+0)/2; b: 2 - 2; c alone keeps its score (verl's rloo)
    close(per_seq(adv), [1.0, 0.0, -0.5, 5.0, 0.0, -0.5])
    assert torch.equal(adv, ret)


def test_remax_hand_case():
    rewards = f64([[0, 0, 1], [0, 3, 99], [1, 2, 3]])
    mask = f64([[1, 1, 1], [1, 1, 0], [1, 1, 1]])
    adv, ret = compute_advantages("remax", token_level_rewards=rewards, response_mask=mask,
                                  reward_baselines=f64([0.25, 1.0, 0.0]), gamma=0.5)   # gamma is not used
    close(ret, [[1, 1, 1], [3, 3, 0], [6, 5, 3]])
    close(adv, [[0.75, 0.75, 0.75], [2, 2, 0], [6, 5, 3]])


def test_reinforce_plus_plus_hand_case():
    rewards = f64([[0, 0, 1], [0, 2, 7]])
    mask = f64([[1, 1, 1], [1, 1, 0]])
    adv, ret = compute_advantages("reinforce_plus_plus", token_level_rewards=rewards, response_mask=mask, gamma=0.5)
    close(ret, [[0.25, 0.5, 1.0], [1.0, 2.0, 0.0]])
    # valid returns 0.25 0.5 1 1 2: mean 0.95, unbiased var 1.8 / 4 = 0.45
    d = math.sqrt(0.45 + 1e-8)
    close(adv, [[-0.7 / d, -0.45 / d, 0.05 / d], [0.05 / d, 1.05 / d, 0.0]])


def test_reinforce_plus_plus_baseline_hand_case():
    rewards, mask = outcome([1.0, 2.0, 0.0, 4.0], [[1, 1]] * 4)
    adv, ret = compute_advantages("reinforce_plus_plus_baseline", token_level_rewards=rewards, response_mask=mask,
                                  group_ids=[0, 1, 0, 1])
    # centred: 0.5, -1, -0.5, 1 on 2 tokens each; mean 0, unbiased var 5 / 7
    d = math.sqrt(5 / 7 + 1e-8)
    close(adv, [[0.5 / d] * 2, [-1 / d] * 2, [-0.5 / d] * 2, [1 / d] * 2])
    assert torch.equal(adv, ret)


def test_reinforce_plus_plus_baseline_singleton_has_zero_baseline():
    rewards, mask = outcome([1.0, 0.0, 3.0], [[1, 1]] * 3)
    adv, _ = compute_advantages("reinforce_plus_plus_baseline", token_level_rewards=rewards, response_mask=mask,
                                group_ids=["a", "a", "c"])
    # centred 0.5, -0.5, 3 (alone: baseline 0); tokens mean 1, deviations -.5 -1.5 2, var 13 / 5
    d = math.sqrt(13 / 5 + 1e-8)
    close(adv, [[-0.5 / d] * 2, [-1.5 / d] * 2, [2 / d] * 2])


def test_gae_hand_case():
    rewards = f64([[0, 0, 1], [0, 2, 99]])
    values = f64([[0.5, 0.6, 0.7], [1.0, 1.0, 55.0]])
    mask = f64([[1, 1, 1], [1, 1, 0]])
    adv, ret = compute_advantages("gae", token_level_rewards=rewards, response_mask=mask, values=values,
                                  gamma=0.9, lam=0.8)
    # row 0: delta = .04 .03 .3; A2 = .3, A1 = .03 + .72 * .3 = .246, A0 = .04 + .72 * .246 = .21712
    # row 1: delta = (0 + .9 - 1) (2 - 1); A1 = 1, A0 = -.1 + .72 = .62
    raw = [0.21712, 0.246, 0.3, 0.62, 1.0]
    close(ret, [[0.71712, 0.846, 1.0], [1.62, 2.0, 0.0]])
    mean = sum(raw) / 5
    std = math.sqrt(sum((a - mean) ** 2 for a in raw) / 4 + 1e-8)
    close(adv, [[(a - mean) / std for a in raw[:3]], [(a - mean) / std for a in raw[3:]] + [0.0]])


def test_gae_skips_masked_positions_inside_a_response():
    # a masked observation token in the middle: the recursion passes over it (multi-turn)
    rewards, values, mask = f64([[0, 7, 1]]), f64([[0.5, 9.0, 0.7]]), f64([[1, 0, 1]])
    _, ret = compute_advantages("gae", token_level_rewards=rewards, response_mask=mask, values=values)
    # A2 = 1 - .7 = .3; A0 = (0 + .7 - .5) + .3 = .5; returns = A + V
    close(ret, [[1.0, 0.0, 1.0]])


# ---- edge cases --------------------------------------------------------------------------------

GROUP_ESTIMATORS = ("grpo", "rloo", "reinforce_plus_plus_baseline")


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_all_equal_rewards_in_a_group_give_zero_advantage(name):
    rewards, mask = outcome([1.0, 1.0, 1.0, 0.0, 1.0], [[1, 1]] * 5)
    adv, _ = compute_advantages(name, token_level_rewards=rewards, response_mask=mask, group_ids=[7, 7, 7, 8, 8])
    assert torch.all(adv[:3] == 0)
    assert torch.all(adv[3:] != 0)


def test_single_token_responses():
    rewards, mask = outcome([1.0, 0.0], [[1], [1]])
    adv, _ = compute_advantages("grpo", token_level_rewards=rewards, response_mask=mask, group_ids=[0, 0])
    # mean 0.5, deviations +-0.5, unbiased std sqrt(0.5)
    close(adv, [[0.5 / (math.sqrt(0.5) + 1e-6)], [-0.5 / (math.sqrt(0.5) + 1e-6)]])
    # one valid token in the whole batch: whitening has no spread -> 0, not NaN (verl raises here)
    adv, ret = compute_advantages("gae", token_level_rewards=f64([[2.0, 0]]), response_mask=f64([[1, 0]]),
                                  values=f64([[0.5, 0]]))
    close(adv, [[0.0, 0.0]])
    close(ret, [[2.0, 0.0]])


@pytest.mark.parametrize("name", ["gae", "grpo", "rloo", "remax", "reinforce_plus_plus",
                                  "reinforce_plus_plus_baseline"])
def test_all_masked_row_gives_zeros_and_no_nan(name):
    rewards = f64([[0, 1.0], [5.0, 5.0], [0, 0.0]])
    mask = f64([[1, 1], [0, 0], [1, 1]])
    adv, ret = compute_advantages(name, token_level_rewards=rewards, response_mask=mask, group_ids=[0, 0, 0],
                                  values=f64([[0.1, 0.2], [0.3, 0.4], [0.5, 0.6]]),
                                  reward_baselines=f64([0.5, 0.5, 0.5]))
    assert torch.isfinite(adv).all() and torch.isfinite(ret).all()
    assert torch.all(adv[1] == 0) and torch.all(ret[1] == 0)
    # every row masked: still no NaN
    adv, ret = compute_advantages(name, token_level_rewards=rewards, response_mask=torch.zeros(3, 2),
                                  group_ids=[0, 1, 1], values=rewards, reward_baselines=f64([0.0, 0.0, 0.0]))
    assert torch.all(adv == 0) and torch.all(ret == 0)


def test_bool_and_float_masks_agree_and_dtype_is_at_least_float32():
    rewards, mask = outcome(SCORES, MASK)
    a_float, _ = compute_advantages("grpo", token_level_rewards=rewards.float(), response_mask=mask.float(),
                                    group_ids=np.array(IDS))
    a_bool, _ = compute_advantages("grpo", token_level_rewards=rewards.float(), response_mask=mask.bool(),
                                   group_ids=tuple(IDS))
    assert a_float.dtype == torch.float32 and torch.equal(a_float, a_bool)
    a_half, _ = compute_advantages("grpo", token_level_rewards=rewards.bfloat16(), response_mask=mask,
                                   group_ids=IDS)
    assert a_half.dtype == torch.float32


def test_missing_inputs_are_reported_by_name():
    rewards, mask = outcome([1.0, 0.0], [[1, 1], [1, 1]])
    with pytest.raises(AlgorithmError, match="needs values"):
        compute_advantages("gae", token_level_rewards=rewards, response_mask=mask)
    with pytest.raises(AlgorithmError, match="needs group_ids"):
        compute_advantages("grpo", token_level_rewards=rewards, response_mask=mask)
    with pytest.raises(AlgorithmError, match="needs reward_baselines"):
        compute_advantages("remax", token_level_rewards=rewards, response_mask=mask)
    with pytest.raises(AlgorithmError, match="3 entries but the batch has 2"):
        compute_advantages("grpo", token_level_rewards=rewards, response_mask=mask, group_ids=[1, 2, 3])
    with pytest.raises(AlgorithmError, match="values must be a tensor of shape"):
        compute_advantages("gae", token_level_rewards=rewards, response_mask=mask, values=rewards[:, :1])
    with pytest.raises(AlgorithmError, match="response_mask"):
        compute_advantages("grpo", token_level_rewards=rewards, response_mask=mask[:, :1], group_ids=[1, 1])
    with pytest.raises(AlgorithmError, match="did you mean 'grpo'"):
        compute_advantages("gpro", token_level_rewards=rewards, response_mask=mask, group_ids=[1, 1])
