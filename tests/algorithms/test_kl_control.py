"""KL estimators (hand values, clamps) and the fixed/adaptive KL controllers with JSON state."""

from __future__ import annotations

import json
import math

import pytest
import torch

from rlctl.algorithms import (AdaptiveKLController, AlgorithmError, FixedKLController, apply_kl_in_reward,
                              kl_penalty, make_kl_controller)

LN2 = math.log(2)


@pytest.mark.parametrize("kinds, expected", [
    # log_ratio = ln .5 - ln .25 = ln 2 (row 0) and -ln 2 (row 1)
    (("k1", "kl"), [LN2, -LN2]),
    (("abs",), [LN2, LN2]),
    (("k2", "mse"), [0.5 * LN2 ** 2, 0.5 * LN2 ** 2]),
    # exp(-r) + r - 1: 0.5 + ln2 - 1 and 2 - ln2 - 1
    (("k3", "low_var_kl"), [0.5 + LN2 - 1, 2 - LN2 - 1]),
])
def test_kl_kinds_hand_values(kinds, expected):
    logprob = torch.tensor([math.log(0.5), math.log(0.25)], dtype=torch.float64)
    ref = torch.tensor([math.log(0.25), math.log(0.5)], dtype=torch.float64)
    for kind in kinds:
        torch.testing.assert_close(kl_penalty(logprob, ref, kind), torch.tensor(expected, dtype=torch.float64))


def test_low_var_kl_is_clamped_like_verl():
    logprob = torch.tensor([0.0, -100.0, -1e4])
    ref = torch.tensor([-100.0, 0.0, 0.0])
    out = kl_penalty(logprob, ref, "k3")
    # r clamped to [-20, 20] first: exp(-20) + 20 - 1 = 19.0 -> clamped to 10; exp(20) - 21 -> 10
    torch.testing.assert_close(out, torch.tensor([10.0, 10.0, 10.0]))
    assert torch.isfinite(kl_penalty(logprob, ref, "k1")).all()


def test_unknown_kind_is_reported():
    with pytest.raises(AlgorithmError, match="unknown KL kind 'k4'"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k4")


def test_apply_kl_in_reward_subtracts_on_valid_tokens_only():
    scores = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    old = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))
    ref = torch.log(torch.tensor([[0.25, 0.5], [0.1, 0.1]]))
    mask = torch.tensor([[1, 1], [0, 0]])
    rewards, current_kl = apply_kl_in_reward(scores, old_log_prob=old, ref_log_prob=ref, response_mask=mask,
                                             kl_coef=0.1, kind="k1")
    torch.testing.assert_close(rewards, torch.tensor([[-0.1 * LN2, 1.0], [0.0, 0.0]]))
    # batch mean of per-sequence token means (verl): (ln2 / 2 + 0) / 2 rows
    assert current_kl == pytest.approx(LN2 / 4, rel=1e-6)


def test_adaptive_controller_hand_updates():
    ctl = AdaptiveKLController(init_kl_coef=0.1, target_kl=0.1, horizon=100)
    ctl.update(current_kl=0.2, n_steps=10)      # error clip(1, +-.2) = .2: x (1 + .2 * 10 / 100)
    assert ctl.value == pytest.approx(0.102)
    ctl.update(current_kl=0.05, n_steps=10)     # error -.5 -> -.2: x 0.98
    assert ctl.value == pytest.approx(0.102 * 0.98)
    ctl.update(current_kl=0.11, n_steps=50)     # error .1: x 1.05
    assert ctl.value == pytest.approx(0.102 * 0.98 * 1.05)


def test_controller_state_survives_json_exactly():
    ctl = make_kl_controller("adaptive", kl_coef=0.05, target_kl=0.02, horizon=1000)
    for kl in (0.013, 0.031, 0.0199):
        ctl.update(kl, n_steps=64)
    restored = make_kl_controller("adaptive", kl_coef=1.0, target_kl=1.0, horizon=1)
    restored.load_state_dict(json.loads(json.dumps(ctl.state_dict())))
    for kl in (0.5, 0.001):
        ctl.update(kl, 64)
        restored.update(kl, 64)
    assert restored.value == ctl.value and restored.state_dict() == ctl.state_dict()

    fixed = FixedKLController(0.3)
    fixed.update(10.0, 100)
    assert fixed.value == 0.3
    with pytest.raises(AlgorithmError, match="state is for 'adaptive', not 'fixed'"):
        fixed.load_state_dict(ctl.state_dict())


def test_controller_factory_errors():
    with pytest.raises(AlgorithmError, match="needs target_kl and horizon"):
        make_kl_controller("adaptive", kl_coef=0.1)
    with pytest.raises(AlgorithmError, match="unknown KL controller"):
        make_kl_controller("pid", kl_coef=0.1)
    with pytest.raises(AlgorithmError, match="target_kl > 0"):
        AdaptiveKLController(0.1, 0.0, 10)


@pytest.mark.parametrize("base", ["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl"])
def test_straight_through_kinds_have_the_value_of_theirs_and_the_gradient_of_k2(base):
    """verl's "+" kinds: forward = the named estimator, backward = d/dlogp 0.5 (logp - ref)^2 = logp - ref."""
    import numpy as np

    from rlctl.algorithms import KL_KINDS, kl_penalty

    assert f"{base}+" in KL_KINDS
    rng = np.random.default_rng(0)
    logp = torch.tensor(-np.abs(rng.normal(size=(3, 5))), requires_grad=True)
    ref = torch.tensor(-np.abs(rng.normal(size=(3, 5))))
    mask = torch.tensor(rng.random((3, 5)) < 0.7)
    value = kl_penalty(logp, ref, f"{base}+", response_mask=mask)
    torch.testing.assert_close(value, kl_penalty(logp, ref, base, response_mask=mask))
    (value * mask).sum().backward()
    torch.testing.assert_close(logp.grad, torch.where(mask, logp - ref, torch.zeros(())).detach())


def test_unknown_kl_kind_is_rejected():
    from rlctl.algorithms import AlgorithmError, kl_penalty

    with pytest.raises(AlgorithmError, match="unknown KL kind 'k4\\+'"):
        kl_penalty(torch.zeros(1, 1), torch.zeros(1, 1), "k4+")
