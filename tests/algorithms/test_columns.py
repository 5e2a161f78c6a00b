"""The column table (rlctl.algorithms.columns): what a read starts, how a column reaches an estimator,
and the columns the actor's update takes."""

from __future__ import annotations

import pytest
import torch

from rlctl.algorithms import (COLUMNS, AlgorithmError, algorithm_needs, compute_advantages, get_estimator,
                              register_estimator, update_columns)
from rlctl.algorithms.columns import passes


def test_each_built_in_declares_its_columns_and_the_needs_follow():
    reads = {name: get_estimator(name).reads for name in ("gae", "vapo", "remax", "prime", "spin", "gdpo",
                                                           "optimal_token_baseline", "grpo")}
    assert reads["gae"] == reads["vapo"] == ("values",) and reads["remax"] == ("reward_baselines",)
    assert reads["grpo"] == () and reads["prime"] == ("rm_scores",)
    assert passes(reads["spin"]) == {"reference", "old_log_prob", "real_response"}
    # optional columns start nothing: rollout correction's IS weights come from the config
    assert passes(reads["optimal_token_baseline"]) == {"old_log_prob"}
    gae, spin = algorithm_needs("gae"), algorithm_needs("spin")
    assert gae.critic and not (gae.reference or gae.old_log_prob)
    assert spin.reference and spin.old_log_prob and spin.real_response and not spin.critic
    assert algorithm_needs("remax").greedy_baseline and algorithm_needs("prime").implicit_prm
    assert algorithm_needs("gdpo").reward_components and algorithm_needs("optimal_token_baseline").sum_pi_squared
    assert algorithm_needs("grpo", use_kl_loss=True).reference   # a KL term reads the reference too


def test_a_policy_losss_reads_count_too():
    from rlctl.algorithms import register_policy_loss

    @register_policy_loss("test_columns_ref_reader", reads=("ref_log_prob", "acc"))
    def _loss(**_):
        raise AssertionError("not called")

    assert not algorithm_needs("grpo").reference
    assert algorithm_needs("grpo", policy_loss="test_columns_ref_reader").reference
    assert update_columns(("ref_log_prob", "acc"))[-1] == "acc"   # a read column joins the update's, once
    assert update_columns(("ref_log_prob", "acc")).count("ref_log_prob") == 1


def test_the_update_takes_what_it_took_by_hand():
    from rlctl.workers.parallel import router_replay

    assert set(update_columns()) == {"response_mask", "advantages", "old_log_prob", "ref_log_prob",
                                     "rollout_is_weights", "rollout_log_prob", "teacher_log_prob", "teacher_topk_ids",
                                     "teacher_topk_log_prob", router_replay.COLUMN}


def test_the_flags_of_before_are_refused_naming_reads():
    with pytest.raises(AlgorithmError, match=r"needs_critic is not a declaration; declare the batch columns it reads"):
        register_estimator("test_columns_flagged", needs_critic=True)


def test_columns_reach_the_estimator_in_their_form():
    seen = {}

    @register_estimator("test_columns_forms", reads=("values", "reward_baselines", "real_response", "rollout_is_weights",
                                                     "response_length"))
    def forms(*, token_level_rewards, **inputs):
        seen.update(inputs)
        return token_level_rewards, token_level_rewards

    rewards, mask = torch.tensor([[1.0, 0.0], [2.0, 3.0]], dtype=torch.float64), torch.tensor([[1, 0], [1, 1]])
    compute_advantages("test_columns_forms", token_level_rewards=rewards, response_mask=mask,
                       values=torch.tensor([[0.5, 9.0], [1.0, 2.0]]), reward_baselines=torch.tensor([0.25, 0.5]),
                       real_response=torch.tensor([1, 0]), response_length=torch.tensor([1, 2]),
                       old_log_prob=torch.zeros(2, 2))   # a table column it does not read: ignored
    assert seen["values"].dtype == torch.float64 and seen["values"].tolist() == [[0.5, 0.0], [1.0, 2.0]]
    assert seen["reward_baselines"].tolist() == [0.25, 0.5] and seen["reward_baselines"].dtype == torch.float64
    assert seen["real_response"].tolist() == [True, False] and seen["rollout_is_weights"] is None
    assert seen["response_length"].tolist() == [1, 2] and "old_log_prob" not in seen
    with pytest.raises(AlgorithmError, match="does not read and which are not batch columns"):
        compute_advantages("grpo", token_level_rewards=rewards, response_mask=mask, group_ids=[0, 0],
                           old_logprob=torch.zeros(2, 2))   # a misspelt column is not silently dropped
    with pytest.raises(AlgorithmError, match="reads the batch column 'response_length', which was not given"):
        compute_advantages("test_columns_forms", token_level_rewards=rewards, response_mask=mask,
                           values=torch.zeros(2, 2), reward_baselines=torch.zeros(2), real_response=torch.ones(2))
    assert COLUMNS["values"].made_by == "critic" and COLUMNS["rollout_is_weights"].optional
