"""Token-level rewards from scores, DAPO overlong shaping and dynamic-sampling group filter."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlctl.algorithms import AlgorithmError, filter_groups, overlong_penalty, scores_to_token_rewards


def test_scores_land_on_the_last_valid_token_or_the_first_of_a_row_without_any():
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [1, 0, 1, 0]])
    out = scores_to_token_rewards([1.0, 2.0, 3.0, 4.0], mask)
    expected = torch.tensor([[0, 1.0, 0, 0], [0, 0, 0, 2.0], [3.0, 0, 0, 0], [0, 0, 4.0, 0]])
    assert out.dtype == torch.float32 and torch.equal(out, expected)
    out64 = scores_to_token_rewards(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64), mask.bool())
    assert out64.dtype == torch.float64 and torch.equal(out64, expected.double())
    with pytest.raises(AlgorithmError, match="one value per row"):
        scores_to_token_rewards([1.0], mask)


def test_overlong_penalty_hand_values():
    # L_max 20, buffer 4: free up to 16, then -1/4 per token up to -1 at 20
    out = overlong_penalty([10, 16, 17, 18, 20], max_response_length=20, buffer_len=4, penalty_factor=1.0)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0], dtype=torch.float64))
    half = overlong_penalty(torch.tensor([18]), max_response_length=20, buffer_len=4, penalty_factor=0.5)
    assert half.tolist() == [-0.25]
    with pytest.raises(AlgorithmError, match="buffer_len must be in"):
        overlong_penalty([1], max_response_length=20, buffer_len=21, penalty_factor=1.0)


def test_filter_groups_keeps_groups_with_spread_and_singletons():
    ids = np.array(["p", "q", "p", "r", "q", "s", "s"])
    #                p:1,1 same   q:1,0 varies   r: alone   s: .5,.5 same
    metric = [1.0, 1.0, 1.0, 0.0, 0.0, 0.5, 0.5]
    result = filter_groups(ids, metric)
    assert result.keep.tolist() == [False, True, False, True, True, False, False]
    assert result.kept_groups == ("q", "r") and result.dropped_groups == ("p", "s")
    assert (result.num_kept, result.num_dropped) == (2, 2)


def test_filter_groups_nan_and_errors():
    result = filter_groups([1, 1, 2, 2], torch.tensor([0.0, float("nan"), 0.0, 1.0]))
    assert result.kept_groups == (2,) and result.dropped_groups == (1,)
    with pytest.raises(AlgorithmError, match="one number per sequence"):
        filter_groups([1, 2], [0.0])
