"""VAPO's estimator (decoupled, length-adaptive GAE) and loss (PPO + positive-example NLL),
hand-computed."""

from __future__ import annotations

import pytest
import torch

from rlctl.algorithms import compute_advantages, get_estimator, policy_loss
from rlctl.algorithms.vapo import length_adaptive_lam


def test_critic_targets_are_the_terminal_reward_whatever_the_values():
    # gamma = 1, lam_critic = 1 and one terminal reward R: every target is R, for any V
    mask = torch.tensor([[1.0, 1, 1, 1], [1, 1, 0, 0]])
    rewards = torch.tensor([[0.0, 0, 0, 2.5], [0, -1.0, 0, 0]])
    for seed in range(3):
        values = torch.randn(2, 4, generator=torch.Generator().manual_seed(seed)) * 10
        _, returns = compute_advantages("vapo", token_level_rewards=rewards, response_mask=mask, values=values,
                                        gamma=1.0, lam=0.95)
        torch.testing.assert_close(returns, torch.tensor([[2.5, 2.5, 2.5, 2.5], [-1.0, -1.0, 0, 0]]))


def test_a_hundred_tokens_give_lambda_point_eight():
    assert float(length_adaptive_lam(torch.tensor([100]), 0.05)) == pytest.approx(0.8)
    torch.testing.assert_close(length_adaptive_lam(torch.tensor([0, 10, 20, 1000]), 0.05),
                               torch.tensor([0.0, 0.0, 0.0, 0.98], dtype=torch.float64))   # clamped to [0, 1]


def test_advantages_use_each_rows_own_lambda():
    # V = 0, one reward of 1 at the last of l tokens: A_0 = (gamma lam)^(l - 1) before whitening.
    # l = 2 at alpha = 1 gives lam = 1/2 -> A = [0.5, 1]; l = 4 gives lam = 3/4 -> A_0 = 0.421875
    mask = torch.tensor([[1.0, 1, 0, 0], [1, 1, 1, 1]])
    rewards = torch.tensor([[0.0, 1, 0, 0], [0, 0, 0, 1]])
    adv, _ = compute_advantages("vapo", token_level_rewards=rewards, response_mask=mask, values=torch.zeros(2, 4),
                                params={"alpha": 1.0})
    raw = torch.tensor([[0.5, 1, 0, 0], [0.421875, 0.5625, 0.75, 1]])
    valid = raw[mask > 0]
    torch.testing.assert_close(adv[mask > 0], ((valid - valid.mean()) / (valid.var() + 1e-8).sqrt()).float())
    # alpha = 0: algorithm.lam for every row, which is plain GAE
    plain, _ = compute_advantages("gae", token_level_rewards=rewards, response_mask=mask, values=torch.zeros(2, 4),
                                  lam=0.9)
    same, _ = compute_advantages("vapo", token_level_rewards=rewards, response_mask=mask, values=torch.zeros(2, 4),
                                 lam=0.9, params={"alpha": 0.0})
    torch.testing.assert_close(plain, same)
    assert get_estimator("vapo").reads == ("values",)


def loss_inputs():
    gen = torch.Generator().manual_seed(0)
    old = -torch.rand(3, 4, generator=gen)
    new = (old + 0.1 * torch.randn(3, 4, generator=gen)).requires_grad_(True)
    mask = torch.tensor([[1.0, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]])
    return dict(old_log_prob=old, log_prob=new, advantages=torch.randn(3, 4, generator=gen), response_mask=mask,
                clip_ratio_high=0.28)


def test_mu_zero_is_plain_ppo_and_mu_adds_the_nll_of_the_correct_rows():
    kw = loss_inputs()
    acc = torch.tensor([1.0, 0.0, 1.0])
    ppo, _ = policy_loss("vanilla", **kw)
    zero, metrics = policy_loss("vapo", params={"nll_coef": 0.0}, acc=acc, **kw)
    assert float(zero) == float(ppo) and metrics["nll_positive_frac"] == pytest.approx(2 / 3)
    with_nll, _ = policy_loss("vapo", acc=acc, **kw)            # mu = 0.1 by default
    lp, mask = kw["log_prob"].detach(), kw["response_mask"]
    nll = -(lp[0, :3].sum() + lp[2, 0]) / 4                      # the paper's: over the correct rows' 4 tokens
    assert float(with_nll) == pytest.approx(float(ppo) + 0.1 * float(nll), rel=1e-6)
    old, _ = policy_loss("vapo", params={"nll_norm": "all_tokens"}, acc=acc, **kw)
    nll = -(lp[0, :3].sum() + lp[2, 0]) / mask.sum()             # rlctl's before: over all 8 tokens
    assert float(old) == pytest.approx(float(ppo) + 0.1 * float(nll), rel=1e-6)


def test_the_nll_is_a_mean_over_the_mini_batchs_correct_tokens_whatever_their_share():
    """VAPO's L_NLL = -1 / sum_{o in T} |o| x sum_{o in T} sum_t log pi (T: the correct responses):
    more incorrect rows beside the same correct ones leave it as it is, and micro-batches with the
    mini-batch's LossNorm (correct_tokens) sum to the whole mini-batch's NLL."""
    from rlctl.algorithms import LossNorm

    kw = loss_inputs()
    params = {"nll_coef": 1.0}
    acc = torch.tensor([1.0, 0.0, 1.0])
    _, few = policy_loss("vapo", params=params, acc=acc, **kw)
    wide = {k: torch.cat([v, v[1:2].expand(5, -1)]) if torch.is_tensor(v) and v.dim() == 2 else v
            for k, v in kw.items()}                                 # 5 more incorrect rows
    _, many = policy_loss("vapo", params=params, acc=torch.cat([acc, torch.zeros(5)]), **wide)
    assert many["nll_loss"] == pytest.approx(few["nll_loss"], rel=1e-6)
    mask = kw["response_mask"]
    norm = LossNorm.for_minibatch(mask)
    norm = LossNorm(tokens=norm.tokens, seqs=norm.seqs, correct_tokens=float(mask[acc > 0].sum()))
    parts = [policy_loss("vapo", params=params, acc=acc[rows], norm=norm,
                         **{k: v[rows] if torch.is_tensor(v) else v for k, v in kw.items()})[1]["nll_loss"]
             for rows in (slice(0, 1), slice(1, 3))]
    assert sum(parts) == pytest.approx(few["nll_loss"], rel=1e-6)


def test_the_mini_batch_norm_counts_the_correct_rows_tokens():
    import numpy as np

    from rlctl.runtime.batch import Batch
    from rlctl.workers.compute.training import minibatch_norm

    mask = np.array([[1, 1, 1, 0], [1, 1, 1, 1], [1, 0, 0, 0]], dtype=np.float32)
    norm = minibatch_norm(Batch({"response_mask": mask, "acc": np.array([1.0, 0.0, 1.0])}), horizon=4)
    assert (norm.tokens, norm.correct_tokens) == (8.0, 4.0)
    assert minibatch_norm(Batch({"response_mask": mask}), horizon=4).correct_tokens is None


def test_nll_norm_is_checked_by_name():
    with pytest.raises(ValueError, match="nll_norm must be one of correct_tokens, all_tokens"):
        policy_loss("vapo", params={"nll_norm": "tokens"}, acc=torch.ones(3), **loss_inputs())
