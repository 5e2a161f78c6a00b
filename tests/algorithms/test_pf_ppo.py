"""PF-PPO's weights and per-prompt resampling, hand-computed (rlctl.algorithms.pf_ppo)."""

from __future__ import annotations

import numpy as np
import pytest

from rlctl.algorithms import AlgorithmError, pf_ppo_resample, pf_ppo_weights


def draws(scores, method, seeds=range(500), group_ids=None, weight_pow=2.0):
    ids = group_ids or ["p"] * len(scores)
    return np.stack([pf_ppo_resample(np.array(scores), ids, method, weight_pow, np.random.default_rng(s))
                     for s in seeds])


def test_weights_are_verls_rules():
    np.testing.assert_allclose(pf_ppo_weights([0.0, -2.0, 0.5, 1.0], "pow", 2.0), [0.0, 4.0, 0.25, 1.0])
    np.testing.assert_allclose(pf_ppo_weights([0.2, 0.5, 0.9, 0.5], "max_min"), [1, 0, 1, 0])
    np.testing.assert_allclose(pf_ppo_weights([1.0, 0.0, 1.0, 0.0], "max_random"), [0.4, 0.1, 0.4, 0.1])
    with pytest.raises(AlgorithmError, match="unknown PF-PPO reweight_method 'best'"):
        pf_ppo_weights([1.0], "best")


def test_pow_resamples_only_the_rows_with_a_score():
    taken = draws([0, 0, 1, 1], "pow")
    assert set(np.unique(taken)) == {2, 3}          # rows 0-1 weigh |0|^2 = 0
    assert 0.45 < (taken == 2).mean() < 0.55        # 2 and 3 weigh 1 each


def test_max_random_picks_the_best_four_sevenths_of_the_time():
    taken = draws([1, 0, 0, 0], "max_random")       # 0.4 / (0.4 + 3 x 0.1) = 4/7
    assert (taken == 0).mean() == pytest.approx(4 / 7, abs=0.04)
    assert set(np.unique(taken)) == {0, 1, 2, 3}


def test_max_min_keeps_the_best_and_the_worst():
    assert set(np.unique(draws([0.2, 0.5, 0.9, 0.5], "max_min"))) == {0, 2}


def test_each_prompt_is_resampled_within_itself_to_its_own_size():
    ids = ["a", "b", "a", "b", "a", "b"]                # rows need not be adjacent
    taken = draws([1, 0, 0, 1, 0, 0], "max_min", group_ids=ids)
    a, b = [0, 2, 4], [1, 3, 5]
    assert np.isin(taken[:, a], a).all() and np.isin(taken[:, b], b).all()   # row i's replacement is of i's prompt
    # group a's best is row 0, its worst rows 2 and 4 (tied): all three kept; b likewise
    assert set(np.unique(taken[:, a])) == {0, 2, 4} and set(np.unique(taken[:, b])) == {1, 3, 5}
    taken = draws([1, 0, 0, 1, 0, 0], "pow", group_ids=ids)
    assert (taken[:, a] == 0).all() and (taken[:, b] == 3).all()


def test_a_group_of_zero_weights_keeps_its_rows():
    taken = draws([0, 0, 2, 0], "pow", group_ids=["a", "a", "b", "b"])
    assert (taken[:, :2] == [0, 1]).all() and (taken[:, 2:] == 2).all()


def test_the_draw_is_a_function_of_the_seed():
    one = pf_ppo_resample(np.array([1.0, 0.5, 0.2, 0.9]), list("aaaa"), "pow", 2.0, np.random.default_rng(7))
    two = pf_ppo_resample(np.array([1.0, 0.5, 0.2, 0.9]), list("aaaa"), "pow", 2.0, np.random.default_rng(7))
    np.testing.assert_array_equal(one, two)
