"""PRIME's accuracy filtering as options of dynamic sampling's group filter: a band of mean
accuracy (ends included, as verl's recipe) and the drop of groups with a truncated response."""

from __future__ import annotations

import numpy as np
import pytest

from rlctl.algorithms import AlgorithmError, filter_groups

# four prompts of n = 4, prompt-major; acc means 0, 0.25, 0.5, 1.0
IDS = np.repeat(["a", "b", "c", "d"], 4)
ACC = np.array([0, 0, 0, 0,   1, 0, 0, 0,   1, 0, 1, 0,   1, 1, 1, 1], dtype=np.float32)


def test_band_keeps_the_groups_whose_mean_lies_inside():
    result = filter_groups(IDS, ACC, band=(0.2, 0.8))
    assert result.kept_groups == ("b", "c") and result.dropped_groups == ("a", "d")
    assert result.keep.tolist() == [False] * 4 + [True] * 8 + [False] * 4


def test_band_ends_are_included_and_a_nan_mean_is_outside():
    assert filter_groups(IDS, ACC, band=(0.25, 0.5)).kept_groups == ("b", "c")     # both ends are kept
    assert filter_groups(IDS, ACC, band=(0.3, 0.4)).kept_groups == ()
    assert filter_groups(IDS, ACC, band=(0.0, 1.0)).kept_groups == ("a", "b", "c", "d")
    assert filter_groups(IDS, ACC, band=(1.0, 1.0)).kept_groups == ("d",)
    # unlike the spread test, a group of one is judged by its value
    assert filter_groups(["x", "y"], [1.0, 0.0], band=(0.5, 1.0)).kept_groups == ("x",)
    assert filter_groups(["x", "x", "y", "y"], [np.nan, 1.0, 0.0, 1.0], band=(0.0, 1.0)).kept_groups == ("y",)


def test_truncated_drops_exactly_the_groups_with_a_truncated_response():
    truncated = np.zeros(16, dtype=bool)
    truncated[[5, 15]] = True          # one response of b, one of d
    banded = filter_groups(IDS, ACC, band=(0.0, 1.0), truncated=truncated)
    assert banded.kept_groups == ("a", "c") and banded.dropped_groups == ("b", "d")
    assert banded.keep.tolist() == [True] * 4 + [False] * 4 + [True] * 4 + [False] * 4
    # with the spread test: a and d have no spread, b has a truncated response
    assert filter_groups(IDS, ACC, truncated=truncated).kept_groups == ("c",)
    assert filter_groups(IDS, ACC, truncated=np.zeros(16, dtype=bool)).kept_groups == ("b", "c")


def test_columns_stay_aligned_when_groups_are_interleaved():
    # rows of the groups out of order: each kept row is one of its own group's, in its place
    order = np.random.default_rng(0).permutation(16)
    ids, acc, row = IDS[order], ACC[order], np.arange(16)[order]
    truncated = np.isin(row, [8])      # the first response of c
    result = filter_groups(ids, acc, band=(0.2, 0.8), truncated=truncated)
    assert result.kept_groups == ("b",) and result.dropped_groups == tuple(g for g in dict.fromkeys(ids) if g != "b")
    assert sorted(row[result.keep].tolist()) == [4, 5, 6, 7]
    assert (ids[result.keep] == "b").all() and acc[result.keep].sum() == 1


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_band_02_08_equals_the_spread_filter_for_binary_accuracy_and_small_groups(n):
    # every mean of n <= 5 binary values other than 0 and 1 lies in [0.2, 0.8]: the same groups
    rng = np.random.default_rng(n)
    ids = np.repeat(np.arange(200), n)
    acc = (rng.random(200 * n) < rng.random(200).repeat(n)).astype(np.float32)
    band = filter_groups(ids, acc, band=(0.2, 0.8))
    spread = filter_groups(ids, acc)
    assert 0 < band.num_kept < 200
    assert band.keep.tolist() == spread.keep.tolist() and band.kept_groups == spread.kept_groups


def test_band_differs_from_the_spread_filter_at_n_6():
    acc = [1, 0, 0, 0, 0, 0]           # mean 1/6 < 0.2, yet the group's accuracy varies
    assert filter_groups(["g"] * 6, acc).kept_groups == ("g",)
    assert filter_groups(["g"] * 6, acc, band=(0.2, 0.8)).kept_groups == ()


def test_bad_band_and_truncated_shapes_are_refused():
    with pytest.raises(AlgorithmError, match="lo <= hi"):
        filter_groups(IDS, ACC, band=(0.8, 0.2))
    with pytest.raises(AlgorithmError, match="truncated must hold one flag per sequence"):
        filter_groups(IDS, ACC, truncated=[True, False])
