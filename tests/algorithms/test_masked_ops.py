"""masked_mean / masked_var / masked_whiten, entropy_from_logits, log_probs_from_logits."""

from __future__ import annotations

import math

import numpy as np
import torch

from rlctl.algorithms import entropy_from_logits, log_probs_from_logits, masked_mean, masked_var, masked_whiten
from rlctl.algorithms.functional import group_index

NAN, INF = float("nan"), float("inf")


def test_masked_mean_and_var_ignore_padding_even_nan():
    values = torch.tensor([[1.0, 2.0, NAN], [3.0, INF, 6.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    assert masked_mean(values, mask).item() == 3.0                  # (1 + 2 + 3 + 6) / 4
    torch.testing.assert_close(masked_mean(values, mask, dim=-1), torch.tensor([1.5, 4.5], dtype=torch.float64))
    assert masked_var(values, mask).item() == 14 / 3                # (4 + 1 + 0 + 9) / (4 - 1)
    assert masked_var(values, mask, unbiased=False).item() == 14 / 4


def test_masked_whiten_hand_case_and_degenerate_masks():
    values = torch.tensor([[1.0, 2.0, NAN], [3.0, INF, 6.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]])
    s = math.sqrt(14 / 3 + 1e-8)
    torch.testing.assert_close(masked_whiten(values, mask),
                               torch.tensor([[-2 / s, -1 / s, 0.0], [0.0, 0.0, 3 / s]], dtype=torch.float64))
    torch.testing.assert_close(masked_whiten(values, mask, shift_mean=False),
                               torch.tensor([[-2 / s + 3, -1 / s + 3, 0.0], [3.0, 0.0, 3 / s + 3]],
                                            dtype=torch.float64))
    one = torch.tensor([[0, 0, 0], [0, 0, 1]])
    assert torch.equal(masked_whiten(values, one), torch.zeros(2, 3, dtype=torch.float64))
    assert torch.equal(masked_whiten(values, torch.zeros(2, 3)), torch.zeros(2, 3, dtype=torch.float64))
    assert masked_mean(values, torch.zeros(2, 3)).item() == 0.0


def test_entropy_from_logits_hand_values():
    logits = torch.tensor([[0.0, 0.0, 0.0, 0.0],                       # uniform over 4: ln 4
                           [5.0, -INF, -INF, -INF],                    # one token left: 0, not NaN
                           [math.log(1.0), math.log(3.0), -INF, -INF]],  # p = .25, .75
                          dtype=torch.float64)
    expected = [math.log(4), 0.0, -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))]
    torch.testing.assert_close(entropy_from_logits(logits), torch.tensor(expected, dtype=torch.float64))
    assert entropy_from_logits(torch.zeros(2, 3, 7)).shape == (2, 3)


def test_log_probs_from_logits_matches_log_softmax():
    logits = torch.tensor([[[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]]], dtype=torch.float64)
    labels = torch.tensor([[2, 1]])
    z = math.log(math.exp(1) + math.exp(2) + math.exp(3))
    torch.testing.assert_close(log_probs_from_logits(logits, labels),
                               torch.tensor([[3 - z, -math.log(3)]], dtype=torch.float64))


def test_group_index_accepts_any_hashables_in_first_seen_order():
    index, n = group_index(["q", ("t", 1), "q", 7, ("t", 1)])
    assert n == 3 and index.tolist() == [0, 1, 0, 2, 1]
    index, n = group_index(np.array(["b", "a", "b"]))
    assert n == 2 and index.tolist() == [0, 1, 0]
    index, n = group_index(torch.tensor([5, 5, 2]))
    assert n == 2 and index.tolist() == [0, 0, 1]
