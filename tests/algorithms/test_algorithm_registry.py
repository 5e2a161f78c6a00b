"""Registries: duplicates rejected, user estimators/losses usable by name, needs declarations."""

from __future__ import annotations

import pytest
import torch

from rlctl.algorithms import (AlgorithmError, Needs, algorithm_needs, compute_advantages, estimator_names,
                              get_estimator, get_policy_loss, policy_loss, policy_loss_names, register_estimator,
                              register_policy_loss)


def test_builtins_are_registered():
    assert set(estimator_names()) >= {"gae", "grpo", "rloo", "remax", "reinforce_plus_plus",
                                      "reinforce_plus_plus_baseline"}
    assert set(policy_loss_names()) >= {"vanilla", "gspo"}
    assert get_policy_loss("gspo").loss_agg_mode == "seq-mean-token-mean"
    assert get_policy_loss("vanilla").loss_agg_mode is None


@pytest.mark.parametrize("name, critic, group, greedy", [
    ("gae", True, 1, False), ("grpo", False, 2, False), ("rloo", False, 2, False), ("remax", False, 1, True),
    ("reinforce_plus_plus", False, 1, False), ("reinforce_plus_plus_baseline", False, 2, False),
])
def test_needs_come_from_declarations_and_kl_settings(name, critic, group, greedy):
    assert algorithm_needs(name, kl_in_reward=False, use_kl_loss=False) == Needs(critic, False, greedy, group)
    assert algorithm_needs(name, kl_in_reward=True, use_kl_loss=False).reference
    assert algorithm_needs(name, kl_in_reward=False, use_kl_loss=True).reference


def test_registering_an_existing_name_is_an_error():
    with pytest.raises(AlgorithmError, match="'grpo' is already registered"):
        register_estimator("grpo")
    with pytest.raises(AlgorithmError, match="'vanilla' is already registered"):
        register_policy_loss("vanilla")

    @register_estimator("test_registry_once")
    def first(**_):
        raise AssertionError("never called")

    with pytest.raises(AlgorithmError, match="already registered"):
        register_estimator("test_registry_once")(first)
    with pytest.raises(AlgorithmError, match="non-empty string"):
        register_estimator("")


def test_a_user_estimator_runs_by_name_with_its_declared_needs():
    @register_estimator("test_registry_max_baseline", needs_group=True)
    def max_baseline(*, token_level_rewards, response_mask, group_ids, **_):
        # advantage = score - best score of the group
        scores = token_level_rewards.sum(-1)
        best = {g: max(s for s, h in zip(scores.tolist(), group_ids) if h == g) for g in group_ids}
        adv = (scores - torch.tensor([best[g] for g in group_ids])).unsqueeze(-1) * response_mask
        return adv, adv

    spec = get_estimator("test_registry_max_baseline")
    assert spec.needs_group and spec.min_group_size == 2 and spec.reads == ()
    rewards = torch.tensor([[0.0, 1.0], [0.0, 3.0], [2.0, 0.0]])
    mask = torch.tensor([[1, 1], [1, 1], [1, 0]])
    adv, _ = compute_advantages("test_registry_max_baseline", token_level_rewards=rewards, response_mask=mask,
                                group_ids=["x", "x", "y"])
    torch.testing.assert_close(adv, torch.tensor([[-2.0, -2.0], [0.0, 0.0], [0.0, 0.0]]))
    with pytest.raises(AlgorithmError, match="needs group_ids"):
        compute_advantages("test_registry_max_baseline", token_level_rewards=rewards, response_mask=mask)


def test_a_bad_user_estimator_output_is_reported():
    @register_estimator("test_registry_bad_shape")
    def bad(*, token_level_rewards, **_):
        return token_level_rewards.sum(-1), token_level_rewards

    with pytest.raises(AlgorithmError, match="returned advantages that is not a"):
        compute_advantages("test_registry_bad_shape", token_level_rewards=torch.zeros(2, 3),
                           response_mask=torch.ones(2, 3))


def test_a_user_policy_loss_runs_by_name():
    @register_policy_loss("test_registry_reinforce")
    def reinforce(*, log_prob, advantages, response_mask, loss_agg_mode, norm, **_):
        from rlctl.algorithms import aggregate_loss
        return aggregate_loss(-advantages * log_prob, response_mask, loss_agg_mode, norm=norm), {}

    log_prob = torch.tensor([[-1.0, -2.0]])
    loss, metrics = policy_loss("test_registry_reinforce", old_log_prob=log_prob, log_prob=log_prob,
                                advantages=torch.tensor([[1.0, 1.0]]), response_mask=torch.tensor([[1, 0]]))
    assert loss.item() == 1.0 and metrics == {}


def test_an_estimator_may_declare_it_reads_the_reference():
    """reads ref_log_prob: the run loads a reference model without any KL term, and the estimator gets
    ref_log_prob (and old_log_prob, which it reads too), zeroed on padding."""
    seen = {}

    @register_estimator("kl_shaped_test", reads=("ref_log_prob", "old_log_prob"))
    def kl_shaped(*, token_level_rewards, response_mask, ref_log_prob, old_log_prob=None, **_):
        seen.update(ref=ref_log_prob.clone(), old=old_log_prob)
        adv = token_level_rewards - 0.1 * (old_log_prob - ref_log_prob) if old_log_prob is not None \
            else token_level_rewards
        return adv, adv

    needs = algorithm_needs("kl_shaped_test", kl_in_reward=False, use_kl_loss=False)
    assert needs.reference and needs.old_log_prob and not needs.critic
    assert not algorithm_needs("grpo", kl_in_reward=False, use_kl_loss=False).reference
    rewards, mask = torch.tensor([[0.0, 1.0, 0.0]]), torch.tensor([[1.0, 1.0, 0.0]])
    with pytest.raises(AlgorithmError, match="needs ref_log_prob"):
        compute_advantages("kl_shaped_test", token_level_rewards=rewards, response_mask=mask)
    ref, old = torch.tensor([[-1.0, -2.0, float("nan")]]), torch.tensor([[-1.5, -1.0, 7.0]])
    adv, _ = compute_advantages("kl_shaped_test", token_level_rewards=rewards, response_mask=mask,
                                ref_log_prob=ref, old_log_prob=old)
    assert seen["ref"].tolist() == [[-1.0, -2.0, 0.0]] and seen["old"].tolist() == [[-1.5, -1.0, 0.0]]
    assert torch.allclose(adv, torch.tensor([[0.05, 0.9, 0.0]]))
