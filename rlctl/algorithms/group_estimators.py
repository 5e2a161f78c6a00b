"""verl's other advantage estimators, under verl's names: grpo_passk, opo, gpg, gdpo,
optimal_token_baseline.

Same conventions as advantages.py: called through `compute_advantages`, which has zeroed the
padding of every [B, T] input and zeroes it again in the outputs. R_i is a sequence's score
(the sum of its valid token rewards), g its group (prompt).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .advantages import _group_stats, grpo_scores
from .functional import group_index, group_size, group_sum, masked_whiten, sequence_scores
from .registry import AlgorithmError, register_estimator


@register_estimator("grpo_passk", needs_group=True)
def grpo_passk(*, token_level_rewards, response_mask, group_ids, norm_adv_by_std, epsilon, **_):
    """Pass@k training (Chen et al. 2025, arXiv 2503.19595): only the best sample of each group
    learns, with A = R_max - R_second (divided by the group's unbiased std + eps when
    norm_adv_by_std); every other sample gets 0. Ties at the top give 0. Groups of one are an error."""
    scores = sequence_scores(token_level_rewards, response_mask)                 # [B]
    index, n_groups = group_index(group_ids)
    adv = torch.zeros_like(scores)
    for g in range(n_groups):
        members = torch.nonzero(index == g).squeeze(-1)
        if members.numel() < 2:
            raise AlgorithmError(f"grpo_passk needs at least 2 samples per group; group {g} has "
                                 f"{members.numel()}: set rollout.n >= 2")
        group = scores[members]
        top, at = torch.topk(group, 2)
        value = top[0] - top[1]
        adv[members[at[0]]] = value / (group.std() + epsilon) if norm_adv_by_std else value
    adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


@register_estimator("opo", needs_group=True)
def opo(*, token_level_rewards, response_mask, group_ids, **_):
    """OPO (Hao et al. 2025, arXiv 2505.23585): the optimal baseline for on-policy updates,
    b_g = sum_i |y_i| R_i / sum_i |y_i| (length-weighted mean); A_i = R_i - b_g on every token.
    A group of one has baseline 0 (verl's convention)."""
    scores = sequence_scores(token_level_rewards, response_mask)
    lengths = response_mask.sum(-1)
    index, n_groups = group_index(group_ids, scores.device)
    count = group_size(index, n_groups)
    baseline = (group_sum(lengths * scores, index, n_groups) / group_sum(lengths, index, n_groups).clamp(min=1e-30))
    adv = (scores - torch.where(count > 1, baseline[index], torch.zeros_like(scores))).unsqueeze(-1) * response_mask
    return adv, adv


@register_estimator("gpg", needs_group=True)
def gpg(*, token_level_rewards, response_mask, group_ids, **_):
    """GPG (Chu et al. 2025, arXiv 2504.02546): A_i = alpha (R_i - mean_g R), alpha = B / (number of
    samples with a non-zero score, at least 1) corrects for groups that carry no gradient.
    A group of one has mean 0. (verl's f_norm is fixed at 1.)"""
    scores = sequence_scores(token_level_rewards, response_mask)
    mean, _, count = _group_stats(scores, group_ids)
    alpha = scores.shape[0] / torch.count_nonzero(scores).clamp(min=1).to(scores.dtype)
    adv = (alpha * (scores - torch.where(count > 1, mean, torch.zeros_like(mean)))).unsqueeze(-1) * response_mask
    return adv, adv


@dataclass(frozen=True)
class GdpoParams:
    reward_keys: tuple[str, ...] = ()       # the reward components (keys of the reward function's dict) to mix
    reward_weights: tuple[float, ...] = ()  # one weight per reward_keys entry (empty = 1 each)

    def __post_init__(self):
        if self.reward_weights and len(self.reward_weights) != len(self.reward_keys):
            raise ValueError(f"reward_weights has {len(self.reward_weights)} weights for {len(self.reward_keys)} "
                             "reward_keys: give one per key, or none (1 each)")


@register_estimator("gdpo", needs_group=True, reads=("reward_components",), params=GdpoParams)
def gdpo(*, token_level_rewards, response_mask, group_ids, norm_adv_by_std, epsilon, reward_components=None,
         reward_weights=None, **_):
    """GDPO (arXiv 2601.05242): normalise each reward component within its group before mixing.

    A = whiten(sum_k w_k GRPO_k), GRPO_k = (r_k - mean_g r_k) / (std_g r_k + eps) for component k
    [K, B] (the reward's extras named by algorithm.params.reward_keys), w = reward_weights
    (default 1 each); whiten over all valid tokens of the batch. Without components, the one
    component is the score itself (verl's fallback).
    """
    if reward_components is None:
        components = [sequence_scores(token_level_rewards, response_mask)]
    else:
        components = list(reward_components)
    weights = reward_weights if reward_weights is not None and len(reward_weights) else torch.ones(len(components))
    mixed = torch.zeros_like(token_level_rewards)
    for w, component in zip(weights, components):   # a sample without tokens (no model call) counts too
        scores = component.to(token_level_rewards.dtype)
        mixed = mixed + w * (grpo_scores(scores, group_ids, norm_adv_by_std, epsilon).unsqueeze(-1) * response_mask)
    adv = masked_whiten(mixed, response_mask) * response_mask
    return adv, adv


@register_estimator("optimal_token_baseline", needs_group=True,
                    reads=("old_log_prob", "sum_pi_squared", "rollout_is_weights"))
def optimal_token_baseline(*, token_level_rewards, response_mask, group_ids, old_log_prob, sum_pi_squared,
                           rollout_is_weights=None, **_):
    """Optimal Token Baseline (verl): a baseline per prompt group and time step, weighted by each
    path's accumulated score-function variance.

    G_t = sum_{s>=t} r_s; w_t = 1 - 2 pi_t + sum_v pi(v)^2 (||grad log pi_t||^2 of the logits,
    times rho_t^2 with rollout IS weights); W_t = sum_{s<=t} w_s;
    B_t = sum_{i in g} G_it W_it / (sum_{i in g} W_it + 1e-8) over rows valid at t; A_t = G_t - B_t.
    A group of one has no baseline (A = G). returns = G.
    """
    returns = (token_level_rewards * response_mask).flip(-1).cumsum(-1).flip(-1)
    w = 1 - 2 * torch.exp(old_log_prob) + sum_pi_squared
    if rollout_is_weights is not None:
        w = w * rollout_is_weights ** 2
    cumulative = (w * response_mask).cumsum(-1)
    index, n_groups = group_index(group_ids, returns.device)
    count = group_size(index, n_groups)
    numerator = group_sum(returns * cumulative * response_mask, index, n_groups)       # [G, T]
    denominator = group_sum(cumulative * response_mask, index, n_groups) + 1e-8
    baseline = (numerator / denominator)[index]
    baseline = torch.where((count > 1).unsqueeze(-1), baseline, torch.zeros_like(baseline))
    return (returns - baseline) * response_mask, returns
