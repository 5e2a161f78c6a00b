"""PRIME's pure parts, hand-computed: the implicit PRM's process rewards and BCE, verl's masked
leave-one-out, the reverse cumulative sum and the whole estimator."""

from __future__ import annotations

import math

import pytest
import torch

from rlctl.algorithms import (AlgorithmError, algorithm_needs, compute_advantages, get_estimator, masked_rloo,
                              prime_process_rewards, prime_prm_loss)
from rlctl.algorithms.prime import PrimeParams, prime_advantages, prime_terms, reverse_cumsum


def test_a_prm_equal_to_its_reference_gives_zero_rewards_and_bce_ln2():
    log_prob = torch.tensor([[-1.2, -0.3, -2.0], [-0.7, -5.0, -0.1]])
    mask = torch.tensor([[1.0, 1, 0], [1, 1, 1]])
    q = prime_process_rewards(log_prob, log_prob.clone(), mask, beta=0.05)
    assert torch.equal(q, torch.zeros_like(q))
    loss, logits = prime_prm_loss(log_prob, log_prob.clone(), mask, torch.tensor([1.0, 0.0]), beta=0.05)
    torch.testing.assert_close(logits, torch.zeros(2))
    torch.testing.assert_close(loss, torch.full((2,), math.log(2.0)))


def test_process_rewards_and_bce_by_hand():
    rm = torch.tensor([[-1.0, -2.0, 9.0]])
    ref = torch.tensor([[-2.0, -2.5, -7.0]])
    mask = torch.tensor([[1.0, 1, 0]])            # the third token is padding: junk never counts
    torch.testing.assert_close(prime_process_rewards(rm, ref, mask, beta=0.5), torch.tensor([[0.5, 0.25, 0.0]]))
    loss, logits = prime_prm_loss(rm, ref, mask, torch.tensor([1.0]), beta=0.5)   # logit 0.5 x (1 + 0.5) = 0.75
    torch.testing.assert_close(logits, torch.tensor([0.75]))
    torch.testing.assert_close(loss, torch.tensor([math.log1p(math.exp(-0.75))]))


def test_outcome_terms_for_one_right_answer_in_four():
    # n = 4, acc [1, 0, 0, 0], reward_gt_coef 5: 5 x (R_i - mean of the other three)
    mask = torch.tensor([[1.0, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]])
    rewards = torch.zeros(4, 3)
    rewards[0, 2] = 1.0                               # the score sits on the last valid token
    gt, dpo = prime_terms(token_level_rewards=rewards, response_mask=mask, group_ids=[7, 7, 7, 7],
                          rm_scores=torch.zeros(4, 3), reward_gt_coef=5.0, reward_dpo_coef=5.0)
    last = torch.tensor([[0.0, 0, 1], [0, 1, 0], [1, 0, 0], [0, 0, 1]])
    expected = torch.tensor([5.0, -5 / 3, -5 / 3, -5 / 3]).unsqueeze(-1) * last
    torch.testing.assert_close(gt, expected)
    assert torch.equal(dpo, torch.zeros_like(dpo))


def test_process_rloo_and_reverse_cumsum_by_hand():
    # n = 2: sample means 0.3 and 0.3; every valid token -> r x 2 - (0.3 + 0.3) / 1
    scores = torch.tensor([[0.2, 0.4, 99.0], [0.0, 0.3, 0.6]])
    mask = torch.tensor([[1.0, 1, 0], [1, 1, 1]])
    rloo = masked_rloo(scores, mask, ["a", "a"])
    torch.testing.assert_close(rloo, torch.tensor([[-0.2, 0.2, 0.0], [-0.6, 0.0, 0.6]]))
    torch.testing.assert_close(reverse_cumsum(rloo, mask), torch.tensor([[0.0, 0.2, 0.0], [0.0, 0.6, 0.6]]))


def test_a_tool_answer_inside_a_response_counts_nowhere():
    """A multi-turn row: the model's turn, a tool's answer (mask 0 inside the response), the model's next
    turn. Whatever the PRM and its reference say on the tool's tokens, the process rewards, the BCE, the
    returns and the advantages are those of the model's tokens alone, and 0 on the tool's."""
    mask = torch.tensor([[1.0, 1, 0, 0, 1], [1, 1, 1, 1, 1]])
    gen = torch.Generator().manual_seed(0)
    rm, ref = torch.randn(2, 5, generator=gen), torch.randn(2, 5, generator=gen)
    other = rm.clone()
    other[0, 2:4] += 7.0                                   # the tool's tokens only
    rewards = torch.zeros(2, 5)
    rewards[0, 4] = 1.0
    outs = []
    for log_prob in (rm, other):
        q = prime_process_rewards(log_prob, ref, mask, beta=0.5)
        assert torch.equal(q[0, 2:4], torch.zeros(2))
        loss, _ = prime_prm_loss(log_prob, ref, mask, torch.tensor([1.0, 0.0]), beta=0.5)
        adv, ret = prime_advantages(token_level_rewards=rewards, response_mask=mask, group_ids=["g", "g"],
                                    rm_scores=q, reward_gt_coef=5.0, reward_dpo_coef=5.0)
        assert torch.equal(adv[0, 2:4], torch.zeros(2)) and torch.equal(ret[0, 2:4], torch.zeros(2))
        outs.append((q, loss, adv, ret))
    for a, b in zip(*outs):
        assert torch.equal(a, b)
    # the model's first turn is credited with what its second turn earned, across the tool's answer
    gt, dpo = prime_terms(token_level_rewards=rewards, response_mask=mask, group_ids=["g", "g"], rm_scores=outs[0][0],
                          reward_gt_coef=5.0, reward_dpo_coef=5.0)
    terms, ret = gt + dpo, outs[0][3]
    torch.testing.assert_close(ret[0, 1], terms[0, 1] + terms[0, 4])
    torch.testing.assert_close(ret[0, 0], terms[0, 0] + terms[0, 1] + terms[0, 4])


def test_groups_need_not_be_adjacent_and_a_group_of_one_is_refused():
    scores = torch.tensor([[1.0], [5.0], [0.0], [7.0]])
    mask = torch.ones(4, 1)
    torch.testing.assert_close(masked_rloo(scores, mask, [0, 1, 0, 1]), torch.tensor([[1.0], [-2.0], [-1.0], [2.0]]))
    with pytest.raises(AlgorithmError, match="at least 2 samples"):
        masked_rloo(scores, mask, [0, 1, 0, 2])


def test_the_estimator_whitens_the_summed_returns():
    mask = torch.tensor([[1.0, 1, 0], [1, 1, 1]])
    rewards = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    rm_scores = torch.tensor([[0.2, 0.4, 99.0], [0.0, 0.3, 0.6]])
    adv, returns = compute_advantages("prime", token_level_rewards=rewards, response_mask=mask, group_ids=[0, 0],
                                      params={"reward_gt_coef": 2.0, "reward_dpo_coef": 1.0},
                                      rm_scores=rm_scores)
    # outcome: R = [1, 0] -> [1, -1] x 2 on the last tokens; process: as in the hand test above
    outcome = torch.tensor([[0.0, 2.0, 0.0], [0.0, 0.0, -2.0]])
    process = torch.tensor([[-0.2, 0.2, 0.0], [-0.6, 0.0, 0.6]])
    expected = reverse_cumsum(outcome + process, mask)
    torch.testing.assert_close(returns, expected)
    valid = expected[mask > 0]
    whitened = (valid - valid.mean()) / torch.sqrt(valid.var() + 1e-8)
    torch.testing.assert_close(adv[mask > 0], whitened)
    assert adv[0, 2] == 0 and returns[0, 2] == 0


def test_prime_declares_its_prm_and_groups():
    spec = get_estimator("prime")
    assert spec.needs_group and spec.reads == ("rm_scores",)
    assert algorithm_needs("prime", kl_in_reward=False, use_kl_loss=False).implicit_prm
    assert not algorithm_needs("grpo", kl_in_reward=False, use_kl_loss=False).implicit_prm


@pytest.mark.parametrize("bad", [{"beta_train": 0.0}, {"reward_gt_coef": -1.0}, {"prm_lr": 0.0},
                                 {"prm_update": "reverse"}, {"prm_label": "score2"}])
def test_params_are_bounded(bad):
    with pytest.raises(ValueError):
        PrimeParams(**bad)
