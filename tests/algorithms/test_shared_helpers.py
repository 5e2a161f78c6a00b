"""The helpers the estimators and losses share: grouped sums over [B, T], group sizes, the
per-sequence mean with micro-batch norms, IS-weighted aggregation, one softmax for two statistics."""

from __future__ import annotations

import torch

from rlctl.algorithms import entropy_from_logits, sum_pi_squared_from_logits
from rlctl.algorithms.aggregation import LossNorm, aggregate_loss, mean_over_sequences
from rlctl.algorithms.functional import group_index, group_size, group_sum
from rlctl.algorithms.losses import weighted_loss


def test_group_sum_and_size_over_rows_of_any_shape():
    index, n = group_index(["b", "a", "b", "c", "a"])
    x = torch.arange(15, dtype=torch.float64).reshape(5, 3)
    expected = torch.stack([x[[0, 2]].sum(0), x[[1, 4]].sum(0), x[3]])
    assert torch.equal(group_sum(x, index, n), expected)
    assert torch.equal(group_sum(x[:, 0], index, n), expected[:, 0])
    assert group_size(index, n).tolist() == [2, 2, 2, 1, 2]


def test_mean_over_sequences_uses_the_mini_batch_count_when_given():
    losses = torch.tensor([1.0, 2.0, 3.0])
    assert mean_over_sequences(losses, None, 3) == 2.0
    assert mean_over_sequences(losses, LossNorm(seqs=6.0, dp_size=2), 3) == 2.0   # 6 / 6 * 2


def test_weighted_loss_is_the_aggregate_of_weighted_tokens():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    losses, weights = torch.tensor([[1.0, 2.0, 9.0], [3.0, 9.0, 9.0]]), torch.tensor([[0.5, 2.0, 7.0], [1.0, 7.0, 7.0]])
    for mode in ("token-mean", "seq-mean-token-mean"):
        assert torch.equal(weighted_loss(losses, mask, mode, None, weights),
                           aggregate_loss(losses * weights * mask, mask, mode))
        assert torch.equal(weighted_loss(losses, mask, mode, None, None), aggregate_loss(losses, mask, mode))


def test_one_softmax_serves_entropy_and_sum_pi_squared():
    logits = torch.randn(4, 11, dtype=torch.float64)
    probs = torch.softmax(logits, dim=-1)
    assert torch.equal(entropy_from_logits(logits, probs), entropy_from_logits(logits))
    assert torch.equal(sum_pi_squared_from_logits(logits, probs), sum_pi_squared_from_logits(logits))
