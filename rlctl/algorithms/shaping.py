"""From per-sequence scores to token-level rewards, and DAPO's overlong reward shaping.

Shapes: scores, response_lengths and penalties are per sequence [B]; response_mask and the
token-level rewards are [B, T] over response tokens.
"""

from __future__ import annotations

import torch

from .registry import AlgorithmError


def scores_to_token_rewards(scores, response_mask: torch.Tensor) -> torch.Tensor:
    """Put each sequence's score on its last valid response token: [B] -> [B, T] (float32 or wider).

    An outcome reward belongs to the whole response, and the last token is where every estimator
    (GAE, REINFORCE++, ReMax, GRPO's row sum) expects it. A row with no valid token (an agent episode
    that made no model call) gets it on its first position, where compute_advantages with episode_ids
    counts it in its group and nothing trains on it (verl writes it to the last padding position).
    Add KL afterwards with apply_kl_in_reward.
    """
    valid = response_mask if response_mask.dtype == torch.bool else response_mask != 0
    scores = torch.as_tensor(scores, device=response_mask.device)
    if valid.dim() != 2 or scores.shape != valid.shape[:1]:
        raise AlgorithmError(f"scores {tuple(scores.shape)} must hold one value per row of response_mask "
                             f"{tuple(valid.shape)}")
    dtype = torch.promote_types(scores.dtype, torch.float32)
    seen = valid.long().cumsum(-1)
    last = valid & (seen == seen[:, -1:])             # the valid position after which no valid one follows
    last[:, 0] |= seen[:, -1] == 0                    # no valid position: the first
    return torch.where(last, scores.to(dtype).unsqueeze(-1), torch.zeros((), dtype=dtype, device=valid.device))


def overlong_penalty(response_lengths, *, max_response_length: int, buffer_len: int,
                     penalty_factor: float) -> torch.Tensor:
    """DAPO's soft overlong punishment per sequence [B] (<= 0, float64), added to the score.

    With L_max = max_response_length and L_cache = buffer_len: 0 for L <= L_max - L_cache, then
    falling linearly to -penalty_factor at L = L_max: min(-(L - (L_max - L_cache)) / L_cache * factor, 0)
    (verl's DAPO reward manager; beyond L_max, which cannot be generated, it keeps falling).
    """
    if not 1 <= buffer_len <= max_response_length:
        raise AlgorithmError(f"overlong buffer_len must be in [1, max_response_length={max_response_length}], "
                             f"got {buffer_len}; lower reward.overlong.buffer_len")
    lengths = torch.as_tensor(response_lengths, dtype=torch.float64)
    exceed = lengths - (max_response_length - buffer_len)
    return torch.clamp(-exceed / buffer_len * penalty_factor, max=0.0)
