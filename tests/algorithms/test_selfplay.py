"""SPIN and SPPO math: the losses equal plain transcriptions of the papers' equations (written out here,
not imported from rlctl), SPIN's advantages give exactly the gradient of its loss through the vanilla
policy loss, SPIN has zero gradient when the reference answer and the generation are the same
sequence, and SPPO's win rates and squared loss behave as the paper says."""

from __future__ import annotations

import math

import pytest
import torch

from rlctl.algorithms import (AlgorithmError, LossNorm, compute_advantages, policy_loss, spin_loss, sppo_loss,
                              win_rates)


def _seqs(seed: int, b: int, t: int = 5) -> torch.Tensor:
    return -torch.rand(b, t, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_spin_loss_is_the_papers_logistic_loss():
    pc, pr, oc, orj = (torch.tensor([-1.0, -3.0]), torch.tensor([-2.0, -1.0]), torch.tensor([-1.5, -2.0]),
                       torch.tensor([-2.5, -0.5]))
    beta = 0.7
    expected = [math.log(1 + math.exp(-beta * ((pc[i] - oc[i]) - (pr[i] - orj[i])).item())) for i in range(2)]
    assert torch.allclose(spin_loss(pc, pr, oc, orj, beta), torch.tensor(expected), atol=1e-6)
    # policy = opponent: every margin is 0 and the loss is log 2
    assert torch.allclose(spin_loss(pc, pr, pc, pr, beta), torch.full((2,), math.log(2.0)))


def test_sppo_loss_is_the_papers_squared_loss():
    log_ratio, win, eta = torch.tensor([0.3, -0.2, 0.0]), torch.tensor([0.9, 0.1, 0.5]), 2.0
    expected = torch.tensor([(0.3 - 2.0 * 0.4) ** 2, (-0.2 - 2.0 * -0.4) ** 2, 0.0])
    assert torch.allclose(sppo_loss(log_ratio, win, eta), expected)


def _spin_batch(seed: int, pairs: int = 3):
    """Rows 0..P-1 generations, P..2P-1 the reference answers, pair id i for rows i and P + i."""
    old = _seqs(seed, 2 * pairs)
    ref = _seqs(seed + 1, 2 * pairs)
    mask = torch.ones_like(old)
    mask[0, 3:] = 0      # a shorter generation
    real = torch.tensor([False] * pairs + [True] * pairs)
    ids = [f"p{i}" for i in range(pairs)] * 2
    return old, ref, mask, real, ids


def test_spin_advantages_give_the_exact_gradient_of_the_spin_loss():
    old, ref, mask, real, ids = _spin_batch(0)
    beta, pairs = 0.5, 3
    adv, _ = compute_advantages("spin", token_level_rewards=torch.zeros_like(old), response_mask=mask, group_ids=ids,
                                old_log_prob=old, ref_log_prob=ref, real_response=real, params={"dpo_beta": beta})
    # the trained surrogate: vanilla policy loss, seq-mean-token-sum, at log_prob = old_log_prob
    log_prob = old.clone().requires_grad_(True)
    loss, _ = policy_loss("vanilla", old_log_prob=old, log_prob=log_prob, advantages=adv, response_mask=mask,
                          loss_agg_mode="seq-mean-token-sum")
    loss.backward()
    # the paper's loss, transcribed: mean over pairs of -log sigmoid(beta * margin)
    direct = old.clone().requires_grad_(True)
    seq, opp = (direct * mask).sum(-1), (ref * mask).sum(-1)
    margin = (seq[pairs:] - opp[pairs:]) - (seq[:pairs] - opp[:pairs])
    (-torch.log(torch.sigmoid(beta * margin))).mean().backward()
    assert torch.allclose(log_prob.grad, direct.grad, atol=1e-10)


def test_spin_gradient_is_zero_when_the_generation_is_the_reference_answer():
    old, ref, mask, real, ids = _spin_batch(1)
    mask[0] = 1
    old[:3], ref[:3] = old[3:], ref[3:]          # every generation equals its pair's reference answer
    adv, _ = compute_advantages("spin", token_level_rewards=torch.zeros_like(old), response_mask=mask, group_ids=ids,
                                old_log_prob=old, ref_log_prob=ref, real_response=real, params={"dpo_beta": 0.1})
    log_prob = old.clone().requires_grad_(True)
    loss, _ = policy_loss("vanilla", old_log_prob=old, log_prob=log_prob, advantages=adv, response_mask=mask,
                          loss_agg_mode="seq-mean-token-sum")
    loss.backward()
    # same tokens -> same log-probs in the model, so the two rows' gradients cancel exactly
    per_sequence = (log_prob.grad * mask).sum(-1)
    assert torch.allclose(per_sequence[:3] + per_sequence[3:], torch.zeros(3, dtype=old.dtype), atol=1e-12)
    assert (adv[3:, 0] > 0).all() and (adv[:3, 0] < 0).all()   # up the reference answer, down the generation


def test_spin_refuses_pairs_without_one_reference_and_one_generation():
    old, ref, mask, real, ids = _spin_batch(2)
    with pytest.raises(AlgorithmError, match="one reference answer and one generation"):
        compute_advantages("spin", token_level_rewards=torch.zeros_like(old), response_mask=mask,
                           group_ids=ids, old_log_prob=old, ref_log_prob=ref, real_response=torch.ones(6).bool())


def test_win_rates_are_the_group_mean_of_bradley_terry_preferences():
    scores = torch.tensor([1.0, 0.0, 0.5, 0.2, 0.2], dtype=torch.float64)
    ids = ["a", "a", "a", "b", "b"]
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    first = (sig(0.0) + sig(1.0) + sig(0.5)) / 3          # itself included, as the paper's 1/K sum_k
    got = win_rates(scores, ids)
    assert got[0].item() == pytest.approx(first)
    assert torch.allclose(got[3:], torch.full((2,), 0.5, dtype=torch.float64))
    # within a group the win rates of y_i and y_k are symmetric around 1/2: they sum to K/2
    assert got[:3].sum().item() == pytest.approx(1.5)


def test_sppo_policy_loss_is_the_squared_loss_toward_eta_times_the_win_rate():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    scores = torch.tensor([1.0, 0.0])
    adv, _ = compute_advantages("sppo", token_level_rewards=torch.zeros(2, 3).index_put_(
        (torch.tensor([0, 1]), torch.tensor([1, 2])), scores), response_mask=mask, group_ids=["g", "g"])
    old = _seqs(3, 2, 3).float()
    log_prob = (old + 0.1).requires_grad_(True)
    eta = 3.0
    loss, metrics = policy_loss("sppo", old_log_prob=old, log_prob=log_prob, advantages=adv, response_mask=mask,
                                sppo_eta=eta, norm=LossNorm(tokens=5.0, seqs=2.0, horizon=3.0, dp_size=1))
    win = torch.tensor([(0.5 + 1 / (1 + math.exp(-1))) / 2, (0.5 + 1 / (1 + math.exp(1))) / 2])
    log_ratio = ((log_prob - old) * mask).sum(-1)
    expected = ((log_ratio - eta * (win - 0.5)) ** 2).mean()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    assert metrics["sppo/log_ratio"] == pytest.approx(log_ratio.mean().item(), rel=1e-5)
    loss.backward()
    # the better sample is pushed up and the worse one down, from log_ratio = 0 ...
    at_old = old.clone().requires_grad_(True)
    policy_loss("sppo", old_log_prob=old, log_prob=at_old, advantages=adv, response_mask=mask, sppo_eta=eta)[0].backward()
    assert at_old.grad[0, 0] < 0 < at_old.grad[1, 0]
    # ... and nothing moves once log_ratio reaches eta * (win - 1/2)
    target = eta * (win - 0.5)
    there = (old + (target / mask.sum(-1)).unsqueeze(-1) * mask).requires_grad_(True)
    policy_loss("sppo", old_log_prob=old, log_prob=there, advantages=adv, response_mask=mask, sppo_eta=eta)[0].backward()
    assert torch.allclose(there.grad, torch.zeros_like(there.grad), atol=1e-6)


def test_sppo_needs_several_samples_per_prompt():
    with pytest.raises(AlgorithmError, match="rollout.n >= 2"):
        compute_advantages("sppo", token_level_rewards=torch.zeros(2, 3), response_mask=torch.ones(2, 3),
                           group_ids=["a", "b"])
