"""aggregate_loss: hand-computed modes and micro-batch accumulation equal to the full mini-batch."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rlctl.algorithms import LOSS_AGG_MODES, AlgorithmError, LossNorm, aggregate_loss

# rows: 1 2 3 | 4 5 (pad 99) | all masked (9s)
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 99.0], [9.0, 9.0, 9.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 1], [1, 1, 0], [0, 0, 0]])


@pytest.mark.parametrize("mode, expected", [
    ("token-mean", 15 / 5),                         # 15 over 5 valid tokens
    ("seq-mean-token-sum", (6 + 9) / 2),            # the all-masked row is not a sequence
    ("seq-mean-token-mean", (6 / 3 + 9 / 2) / 2),
    ("seq-mean-token-sum-norm", (6 + 9) / 2 / 3),   # divided by T = 3
])
def test_modes_hand_case(mode, expected):
    assert aggregate_loss(LOSS, MASK, mode).item() == pytest.approx(expected, abs=1e-12)


def test_norm_overrides_counts_horizon_and_scales_by_dp_size():
    norm = LossNorm(tokens=10.0, seqs=4.0, horizon=5.0, dp_size=2)
    assert aggregate_loss(LOSS, MASK, "token-mean", norm=norm).item() == pytest.approx(15 / 10 * 2)
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-sum", norm=norm).item() == pytest.approx(15 / 4 * 2)
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-mean", norm=norm).item() == pytest.approx(6.5 / 4 * 2)
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", norm=norm).item() == pytest.approx(15 / 4 * 2 / 5)
    assert LossNorm.for_minibatch(MASK, horizon=8) == LossNorm(tokens=5.0, seqs=2.0, horizon=8)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_empty_batch_gives_zero_not_nan(mode):
    zero_mask = torch.zeros(2, 3)
    assert aggregate_loss(LOSS[:2], zero_mask, mode).item() == 0.0
    assert aggregate_loss(LOSS[:2], zero_mask, mode, norm=LossNorm.for_minibatch(zero_mask)).item() == 0.0


def test_mean_of_micro_batch_means_is_not_the_token_mean():
    # why LossNorm exists: micro-batches [row 0] and [row 1] have 3 and 2 tokens
    mean_of_means = (aggregate_loss(LOSS[:1], MASK[:1], "token-mean") + aggregate_loss(LOSS[1:2], MASK[1:2],
                                                                                        "token-mean")) / 2
    assert mean_of_means.item() == pytest.approx((2 + 4.5) / 2)
    assert aggregate_loss(LOSS, MASK, "token-mean").item() != pytest.approx(mean_of_means.item())


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), batch=st.integers(1, 9), width=st.integers(1, 6),
       n_micro=st.integers(1, 4))
def test_accumulated_micro_batches_equal_the_full_mini_batch(mode, seed, batch, width, n_micro):
    rng = np.random.default_rng(seed)
    loss_mat = torch.tensor(rng.normal(size=(batch, width)), requires_grad=True)
    mask = torch.tensor(rng.random((batch, width)) < 0.7)
    full = aggregate_loss(loss_mat, mask, mode, norm=LossNorm(horizon=width) if mode.endswith("norm") else None)
    (full_grad,) = torch.autograd.grad(full, loss_mat)
    norm = LossNorm.for_minibatch(mask, horizon=width)
    bounds = np.linspace(0, batch, n_micro + 1).astype(int)
    total = sum(aggregate_loss(loss_mat[a:b], mask[a:b], mode, norm=norm) for a, b in zip(bounds, bounds[1:]))
    (acc_grad,) = torch.autograd.grad(total, loss_mat)
    torch.testing.assert_close(total, full, atol=1e-12, rtol=1e-12)
    torch.testing.assert_close(acc_grad, full_grad, atol=1e-12, rtol=1e-12)


def test_bad_mode_shape_and_norm_are_reported():
    with pytest.raises(AlgorithmError, match="unknown loss_agg_mode 'mean'"):
        aggregate_loss(LOSS, MASK, "mean")
    with pytest.raises(AlgorithmError, match="must have one shape"):
        aggregate_loss(LOSS, MASK[:, :2], "token-mean")
    with pytest.raises(AlgorithmError, match="LossNorm.tokens must be > 0"):
        LossNorm(tokens=0)
