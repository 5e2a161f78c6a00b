"""Turn a [B, T] loss matrix into the scalar to backpropagate, with micro-batch accumulation.

A mini-batch (one optimizer step) is split into micro-batches whose losses are backpropagated one
after another and summed in the gradients. For the summed gradient to equal the gradient of the
mini-batch objective, every micro-batch must divide by the *mini-batch* normaliser (its token or
sequence count), not its own: a mean of micro-batch means weights a 3-token micro-batch like a
300-token one. `LossNorm` carries those mini-batch counts into `aggregate_loss`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .functional import masked_count, masked_sum
from .registry import AlgorithmError

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


@dataclass(frozen=True)
class LossNorm:
    """Mini-batch normalisers for accumulating micro-batch losses.

    tokens: valid tokens in the whole mini-batch (token-mean).
    seqs: sequences with >= 1 valid token in the mini-batch (seq-mean-* modes).
    horizon: divisor of seq-mean-token-sum-norm (Dr. GRPO's constant; use max_response_length so it
        does not change with each micro-batch's padded width). None = the mask's T.
    dp_size: data-parallel ranks whose gradients are averaged (FSDP/DDP). The loss is multiplied by
        it so the averaged gradient is the gradient of the global objective; tokens/seqs must then
        be counted over all ranks.
    correct_tokens: valid tokens of the mini-batch's rows whose `acc` > 0 (VAPO's positive-example
        NLL is a mean over them); None where the batch has no `acc`.
    """

    tokens: float | None = None
    seqs: float | None = None
    horizon: float | None = None
    dp_size: int = 1
    correct_tokens: float | None = None

    def __post_init__(self):
        for name in ("tokens", "seqs", "horizon", "correct_tokens"):
            value = getattr(self, name)
            if value is not None and not float(value) > 0:
                raise AlgorithmError(f"LossNorm.{name} must be > 0, got {value}; count the whole mini-batch")
        if int(self.dp_size) < 1:
            raise AlgorithmError(f"LossNorm.dp_size must be >= 1, got {self.dp_size}")

    @classmethod
    def for_minibatch(cls, response_mask: torch.Tensor, *, horizon: float | None = None,
                      dp_size: int = 1) -> "LossNorm":
        """Counts of a whole mini-batch mask [B, T], as plain floats (at least 1: an empty
        mini-batch then gives a loss of 0, not NaN)."""
        return cls(tokens=max(float(masked_count(response_mask)), 1.0),
                   seqs=max(float((masked_count(response_mask, dim=-1) > 0).sum()), 1.0),
                   horizon=horizon, dp_size=dp_size)


def aggregate_loss(loss_mat: torch.Tensor, mask: torch.Tensor, mode: str, *,
                   norm: LossNorm | None = None) -> torch.Tensor:
    """Reduce loss_mat [B, T] over valid positions of mask [B, T] to a scalar.

    token-mean:              sum_{i,t} l / N_tokens
    seq-mean-token-sum:      sum_i (sum_t l) / N_seqs
    seq-mean-token-mean:     sum_i (mean_t l) / N_seqs
    seq-mean-token-sum-norm: sum_i (sum_t l) / N_seqs / horizon   (Dr. GRPO; horizon = T by default)
    Without `norm` the counts are this batch's own (verl's agg_loss); rows with no valid token are
    not counted as sequences; an empty batch gives 0. With `norm`, summing the results over the
    micro-batches of a mini-batch equals the result on the whole mini-batch.
    """
    if mode not in LOSS_AGG_MODES:
        raise AlgorithmError(f"unknown loss_agg_mode {mode!r}: use one of {', '.join(LOSS_AGG_MODES)}")
    if loss_mat.shape != mask.shape:
        raise AlgorithmError(f"loss_mat {tuple(loss_mat.shape)} and mask {tuple(mask.shape)} "
                             f"must have one shape [B, T]")
    norm = norm or LossNorm()
    if mode == "token-mean":
        tokens = norm.tokens if norm.tokens is not None else masked_count(mask).clamp(min=1)
        return masked_sum(loss_mat, mask) / tokens * norm.dp_size
    per_seq_tokens = masked_count(mask, dim=-1)
    seq_losses = masked_sum(loss_mat, mask, dim=-1)                     # [B] token sums
    if mode == "seq-mean-token-mean":
        seq_losses = seq_losses / per_seq_tokens.clamp(min=1).to(seq_losses.dtype)
    loss = mean_over_sequences(seq_losses, norm, (per_seq_tokens > 0).sum().clamp(min=1))
    if mode == "seq-mean-token-sum-norm":
        loss = loss / (norm.horizon if norm.horizon is not None else mask.shape[-1])
    return loss


def mean_over_sequences(seq_losses: torch.Tensor, norm: LossNorm | None, seqs) -> torch.Tensor:
    """sum_i l_i / N_seqs * dp_size for per-sequence losses [B]: N_seqs is the mini-batch's count
    (norm.seqs) when accumulating micro-batches, else `seqs`, this batch's own count."""
    norm = norm or LossNorm()
    return seq_losses.sum() / (norm.seqs if norm.seqs is not None else seqs) * norm.dp_size
