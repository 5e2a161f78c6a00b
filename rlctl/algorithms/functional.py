"""Masked statistics, entropy, log-probs and grouping: the small tensor helpers the algorithms share.

Masks are float or bool [B, T]; a position is valid where mask != 0. Values under padding never
reach a result: they are replaced by zero with `torch.where` first, so even NaN or inf padding is
harmless (multiplying by the mask would turn inf * 0 into NaN).
"""

from __future__ import annotations

import numpy as np
import torch


def _valid(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Sum of values where mask is set (all elements when dim is None)."""
    kept = torch.where(_valid(mask), values, torch.zeros((), dtype=values.dtype, device=values.device))
    return kept.sum() if dim is None else kept.sum(dim=dim)


def sequence_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """R_i [B]: the sum of row i's rewards over its valid tokens. A row with no valid token (an agent
    episode that made no model call: rewarded, nothing to train) scores the reward on its first
    position, where scores_to_token_rewards puts it, so it still counts in its group."""
    valid = _valid(response_mask)
    return torch.where(valid.any(-1), masked_sum(token_level_rewards, valid, dim=-1), token_level_rewards[:, 0])


def masked_count(mask: torch.Tensor, dim=None) -> torch.Tensor:
    valid = _valid(mask)
    return valid.sum() if dim is None else valid.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Mean over valid positions; 0 where there are none (not NaN)."""
    count = masked_count(mask, dim).clamp(min=1).to(values.dtype)
    return masked_sum(values, mask, dim) / count


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over all valid positions (Bessel-corrected like verl/TRL); 0 with < 2 valid."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    n = masked_count(mask).to(values.dtype)
    if unbiased and n > 1:
        var = var * n / (n - 1)
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(values - mean) / sqrt(var + 1e-8) with stats over valid positions; 0 under padding.

    Same as verl's masked_whiten on valid positions. With a single valid position var is 0 and the
    result is 0 there (verl raises instead); with none, everything is 0.
    """
    mean, var = masked_mean(values, mask), masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(_valid(mask), whitened, torch.zeros_like(whitened))


def entropy_from_logits(logits: torch.Tensor, probs: torch.Tensor | None = None) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim: [..., V] -> [...].

    H = logsumexp(z) - sum_v p_v z_v. Terms with p_v = 0 are dropped so that -inf logits
    (top-k / banned tokens) give 0 instead of 0 * -inf = NaN. `probs`: softmax(logits) when the
    caller has it already (one softmax for the entropy and sum_pi_squared).
    """
    probs = torch.softmax(logits, dim=-1) if probs is None else probs
    p_times_z = torch.where(probs > 0, probs * logits, torch.zeros((), dtype=logits.dtype, device=logits.device))
    return torch.logsumexp(logits, dim=-1) - p_times_z.sum(dim=-1)


def sum_pi_squared_from_logits(logits: torch.Tensor, probs: torch.Tensor | None = None) -> torch.Tensor:
    """sum_v softmax(logits)_v^2 over the last dim: [..., V] -> [...]. With pi_t the sampled token's
    probability, 1 - 2 pi_t + this is ||d log pi_t / d logits||^2 (the optimal token baseline's weight).
    `probs`: softmax(logits) when the caller has it already."""
    return (torch.softmax(logits, dim=-1) if probs is None else probs).square().sum(-1)


def log_probs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label]: logits [..., V], labels [...] (int) -> [...]."""
    log_z = torch.logsumexp(logits, dim=-1)
    return torch.gather(logits, -1, labels.long().unsqueeze(-1)).squeeze(-1) - log_z


def group_index(group_ids, device=None) -> tuple[torch.Tensor, int]:
    """Map per-sequence group ids (any hashables) to dense ints in first-seen order.

    Returns (index [B] long on `device`, number of groups). Rows of one group need not be adjacent.
    """
    ids = group_ids.tolist() if isinstance(group_ids, (torch.Tensor, np.ndarray)) else list(group_ids)
    dense: dict = {}
    index = [dense.setdefault(g, len(dense)) for g in ids]
    return torch.tensor(index, dtype=torch.long, device=device), len(dense)


def group_sum(x: torch.Tensor, index: torch.Tensor, n_groups: int) -> torch.Tensor:
    """Per-group sums of a [B, ...] tensor -> [G, ...]."""
    return torch.zeros((n_groups, *x.shape[1:]), dtype=x.dtype, device=x.device).index_add_(0, index.to(x.device), x)


def group_size(index: torch.Tensor, n_groups: int) -> torch.Tensor:
    """Each row's group size [B] (long), from group_index's index."""
    return torch.bincount(index, minlength=n_groups)[index]
