"""Policy and value losses: hand-computed values, gradients, metrics and numerical safety."""

from __future__ import annotations

import math

import pytest
import torch

from rlctl.algorithms import AlgorithmError, LossNorm, policy_loss, value_loss

LN = math.log
NEG_INF = float("-inf")


def vanilla_case():
    """Five valid tokens (clip low .2, high .28, dual-clip c = 3), one padding token.

    token  A   ratio  L1=-A r  L2=-A clip(r)  max    dual (A<0)  final  clipped?  lower?
      1    +1  1.5    -1.5     -1.28          -1.28  -           -1.28  yes       -
      2    +1  0.5    -0.5     -0.8           -0.5   -           -0.5   no        -
      3    -1  0.5     0.5      0.8            0.8   min(.8, 3)   0.8   yes       no
      4    -1  5.0     5.0      1.28           5.0   min(5, 3)    3.0   no        yes
      5    +2  1.1    -2.2     -2.2           -2.2   -           -2.2   no        -
    """
    old = torch.zeros(2, 3, dtype=torch.float64)
    new = torch.tensor([[LN(1.5), LN(0.5), LN(0.5)], [LN(5.0), LN(1.1), NEG_INF]], dtype=torch.float64)
    adv = torch.tensor([[1.0, 1.0, -1.0], [-1.0, 2.0, 123.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.float64)
    return old, new.requires_grad_(), adv, mask


def run_vanilla(mode="token-mean", **kw):
    old, new, adv, mask = vanilla_case()
    loss, metrics = policy_loss("vanilla", old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask,
                                clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode=mode, **kw)
    return loss, metrics, new


@pytest.mark.parametrize("mode, expected", [
    ("token-mean", (-1.28 - 0.5 + 0.8 + 3.0 - 2.2) / 5),
    ("seq-mean-token-sum", ((-1.28 - 0.5 + 0.8) + (3.0 - 2.2)) / 2),
    ("seq-mean-token-mean", ((-1.28 - 0.5 + 0.8) / 3 + (3.0 - 2.2) / 2) / 2),
    ("seq-mean-token-sum-norm", ((-1.28 - 0.5 + 0.8) + (3.0 - 2.2)) / 2 / 3),
])
def test_vanilla_ppo_hand_case(mode, expected):
    loss, metrics, _ = run_vanilla(mode)
    assert loss.item() == pytest.approx(expected, abs=1e-12)
    assert metrics["pg_clipfrac"] == pytest.approx(2 / 5)
    assert metrics["pg_clipfrac_lower"] == pytest.approx(1 / 5)
    assert metrics["ppo_kl"] == pytest.approx(-(LN(1.5) + 2 * LN(0.5) + LN(5.0) + LN(1.1)) / 5)


def test_vanilla_ppo_gradient_flows_only_through_unclipped_tokens():
    loss, _, new = run_vanilla()
    loss.backward()
    # d(-A r)/d log_prob = -A r on unclipped tokens (2 and 5), over 5 tokens; clipped ones and padding 0
    expected = torch.tensor([[0.0, -0.5 / 5, 0.0], [0.0, -2.2 / 5, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(new.grad, expected, atol=1e-12, rtol=0)


def test_symmetric_clip_and_clip_higher_differ_only_above_one():
    old, new, adv, mask = vanilla_case()
    low, _ = policy_loss(old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask, clip_ratio_high=0.2)
    # token 1 now clips at 1.2 instead of 1.28: the loss moves by (-1.2 - -1.28) / 5
    high, _ = policy_loss(old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask, clip_ratio_high=0.28)
    assert (low - high).item() == pytest.approx(0.08 / 5, abs=1e-12)


def test_extreme_log_prob_differences_stay_finite():
    old = torch.tensor([[0.0, 0.0, -1e4, 0.0]])
    new = torch.tensor([[-1e4, 1e4, 0.0, NEG_INF]], requires_grad=True)
    adv = torch.tensor([[1.0, -1.0, -2.0, float("nan")]])
    mask = torch.tensor([[1, 1, 1, 0]])
    for name in ("vanilla", "gspo"):
        loss, metrics = policy_loss(name, old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask)
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(new.grad).all(), name
        assert all(math.isfinite(v) for v in metrics.values()), name
        new.grad = None
    # the exploded ratios of negative-advantage tokens are bounded by the dual clip: -A * c
    loss, metrics = policy_loss(old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask)
    assert loss.item() == pytest.approx((-1.0 * math.exp(-20) + 3.0 + 6.0) / 3, rel=1e-6)
    assert metrics["pg_clipfrac_lower"] == pytest.approx(2 / 3)


def test_gspo_hand_case_and_gradient():
    # row 0: log-ratios ln2, 0 -> s = exp(ln2 / 2) = 1.41421, A = +1 -> clipped to 1.2, loss -1.2
    # row 1: log-ratio ln .9 -> s = 0.9 (inside [.8, 1.2]), A = -1 -> loss 0.9; padding ignored
    old = torch.zeros(2, 2, dtype=torch.float64)
    new = torch.tensor([[LN(2.0), 0.0], [LN(0.9), NEG_INF]], dtype=torch.float64, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0], [-1.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1], [1, 0]])
    # GSPO always aggregates seq-mean-token-mean, whatever mode is asked for
    loss, metrics = policy_loss("gspo", old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask,
                                loss_agg_mode="token-mean")
    assert loss.item() == pytest.approx((-1.2 + 0.9) / 2, abs=1e-12)
    assert metrics == pytest.approx({"pg_clipfrac": 2 / 3, "pg_clipfrac_lower": 0.0,
                                     "ppo_kl": -(LN(2.0) + LN(0.9)) / 3})
    loss.backward()
    # unclipped token: d(-A s_t)/d log_prob = -A * s = 0.9, divided by 1 token and 2 sequences
    torch.testing.assert_close(new.grad, torch.tensor([[0.0, 0.0], [0.45, 0.0]], dtype=torch.float64))


def test_value_loss_hand_case():
    # token 1: v 1.5 clipped to 1.2; (1.5-2)^2 = .25 < (1.2-2)^2 = .64 -> .64 (clipped)
    # token 2: v 0.9 inside [.8, 1.2]; (0.9-0)^2 = .81 both -> .81;  loss = 0.5 * (.64 + .81) / 2
    vpreds = torch.tensor([[1.5, 0.9, float("nan")]], dtype=torch.float64, requires_grad=True)
    values = torch.tensor([[1.0, 1.0, 0.0]], dtype=torch.float64)
    returns = torch.tensor([[2.0, 0.0, 5.0]], dtype=torch.float64)
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, metrics = value_loss(vpreds=vpreds, returns=returns, values=values, response_mask=mask, value_clip=0.2,
                               loss_agg_mode="token-mean")
    assert loss.item() == pytest.approx(0.5 * (0.64 + 0.81) / 2, abs=1e-12)
    assert metrics == pytest.approx({"vf_clipfrac": 0.5, "vpred_mean": 1.2})
    loss.backward()
    # clipped token has no gradient; token 2: 0.5 * 2 (v - R) / 2 tokens = 0.45
    torch.testing.assert_close(vpreds.grad, torch.tensor([[0.0, 0.45, 0.0]], dtype=torch.float64))


def test_loss_norm_reaches_the_policy_loss():
    full, _, _ = run_vanilla()
    halved, _, _ = run_vanilla(norm=LossNorm(tokens=10.0))
    assert halved.item() == pytest.approx(full.item() / 2, abs=1e-12)


def test_bad_arguments_are_reported():
    old, new, adv, mask = vanilla_case()
    with pytest.raises(AlgorithmError, match="clip_ratio_c must be > 1"):
        policy_loss(old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask, clip_ratio_c=1.0)
    with pytest.raises(AlgorithmError, match="advantages must be a tensor shaped like"):
        policy_loss(old_log_prob=old, log_prob=new, advantages=adv[:, :1], response_mask=mask)
    with pytest.raises(AlgorithmError, match="unknown loss_agg_mode"):
        policy_loss(old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask, loss_agg_mode="mean")
    with pytest.raises(AlgorithmError, match="unknown policy loss 'vanila': did you mean 'vanilla'"):
        policy_loss("vanila", old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask)
