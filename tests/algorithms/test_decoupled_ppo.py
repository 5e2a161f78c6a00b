"""decoupled_ppo (AReaL's decoupled objective), by hand: the clip is around the proximal policy
(old_log_prob), each token is weighted by pi_prox / pi_behav, tokens over the cap are left out."""

from __future__ import annotations

import math

import pytest
import torch

from rlctl.algorithms import get_policy_loss, policy_loss

COMMON = dict(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, loss_agg_mode="token-mean")


def lp(*probs):
    return torch.tensor([[math.log(p) for p in probs]], dtype=torch.float64)


def test_hand_computed_loss_weights_and_cap():
    prox, behav = lp(0.5, 0.5, 0.5), lp(0.25, 0.1, 0.5)      # weights 2, 5 (over the cap 2.5), 1
    new = lp(0.75, 0.5, 0.55).requires_grad_(True)              # u = 1.5 (clipped at 1.2), 1, 1.1
    adv = torch.tensor([[1.0, 1.0, 1.0]], dtype=torch.float64)
    mask = torch.ones(1, 3)
    loss, m = policy_loss("decoupled_ppo", old_log_prob=prox, log_prob=new, advantages=adv, response_mask=mask,
                          rollout_log_prob=behav, behav_imp_weight_cap=2.5, **COMMON)
    # token 1: -min(1.5, 1.2) * 2 = -2.4; token 2: left out; token 3: -1.1 * 1; mean over 3 tokens
    assert loss.item() == pytest.approx((-2.4 + 0.0 - 1.1) / 3)
    assert m["behav_masked"] == pytest.approx(1 / 3) and m["behav_imp_weight"] == pytest.approx(1.5)
    assert m["pg_clipfrac"] == pytest.approx(1 / 3)
    loss.backward()
    # d/dlog pi of -w u A = -w u A: only token 3 (unclipped, kept) has a gradient
    assert new.grad[0, 0].item() == 0 and new.grad[0, 1].item() == 0
    assert new.grad[0, 2].item() == pytest.approx(-1.1 / 3)


def test_without_rollout_log_probs_it_is_vanilla_ppo():
    g = torch.Generator().manual_seed(0)
    old, new = -torch.rand(4, 6, generator=g), -torch.rand(4, 6, generator=g)
    adv, mask = torch.randn(4, 6, generator=g), (torch.rand(4, 6, generator=g) > 0.2).float()
    args = dict(old_log_prob=old, log_prob=new, advantages=adv, response_mask=mask, **COMMON)
    assert policy_loss("decoupled_ppo", **args)[0].item() == pytest.approx(policy_loss("vanilla", **args)[0].item())


def test_declares_trust_region_and_its_own_correction():
    spec = get_policy_loss("decoupled_ppo")
    assert spec.trust_region and spec.corrects_rollout and spec.clip_higher
    assert not get_policy_loss("gpg").trust_region and not get_policy_loss("cispo").trust_region
