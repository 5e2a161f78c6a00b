"""AReaL's decoupled PPO objective (Fu et al. 2025, "AReaL", arXiv 2505.24298, eq. 5), registered
as "decoupled_ppo": the loss for batches generated several updates ago (rollout.mode = "async").

Three policies: pi_behav generated the tokens (rollout_log_prob, the rollout group's weights,
up to rollout.max_staleness updates old), pi_prox is the trust region's centre (old_log_prob, the
trainer's recompute with the weights before this update), pi_theta is being trained (log_prob):

    J(theta) = E_t[ pi_prox / pi_behav * min(u_t A_t, clip(u_t, 1 - low, 1 + high) A_t) ],  u_t = pi_theta / pi_prox

The clip bounds the update around the recent pi_prox, not the stale pi_behav (PPO clipped around
pi_behav would let a stale batch move the policy far); the detached weight pi_prox / pi_behav
corrects the token's sampling distribution. Tokens whose weight exceeds behav_imp_weight_cap
(rlctl passes algorithm.rollout_correction.rollout_is_threshold) are left out of the loss, as AReaL
does (they still count in the token-mean's denominator). Negative advantages get vanilla's dual clip.
"""

from __future__ import annotations

import torch

from .functional import masked_mean
from .losses import LOG_RATIO_CLAMP, _valid, _where_valid, dual_clip_surrogate, weighted_loss
from .registry import register_policy_loss


@register_policy_loss("decoupled_ppo", clip_higher=True, trust_region=True, corrects_rollout=True)
def decoupled_ppo(*, old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high,
                  clip_ratio_c, loss_agg_mode, norm, rollout_log_prob=None, behav_imp_weight_cap=None,
                  rollout_is_weights=None, **_):
    """[B, T] tensors; rollout_log_prob None (a sampler that reports none: it is the trainer's own
    policy) makes the behaviour weight 1 and the loss vanilla PPO.

    Metrics: pg_clipfrac, pg_clipfrac_lower, ppo_kl = mean(log pi_prox - log pi_theta) as vanilla;
    behav_imp_weight = mean pi_prox / pi_behav over kept tokens; behav_masked = share of tokens
    over the cap."""
    prox = _where_valid(response_mask, old_log_prob)
    behav = prox if rollout_log_prob is None else _where_valid(response_mask, rollout_log_prob.to(prox.dtype))
    advantages = _where_valid(response_mask, advantages)
    with torch.no_grad():
        weight = torch.exp((prox - behav).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
        keep = _valid(response_mask)
        if behav_imp_weight_cap is not None:
            keep = keep & (weight <= behav_imp_weight_cap)
        weight = torch.where(keep, weight, torch.zeros((), dtype=weight.dtype, device=weight.device))
    log_ratio = _where_valid(response_mask, log_prob - prox).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    pg_losses, metrics = dual_clip_surrogate(advantages, log_ratio, response_mask, clip_ratio_low, clip_ratio_high,
                                             clip_ratio_c)
    loss = weighted_loss(pg_losses * weight, response_mask, loss_agg_mode, norm, rollout_is_weights)
    with torch.no_grad():
        metrics["behav_imp_weight"] = masked_mean(weight, keep.to(weight.dtype)).item() if bool(keep.any()) else 0.0
        metrics["behav_masked"] = masked_mean((~keep & _valid(response_mask)).to(weight.dtype), response_mask).item()
    return loss, metrics
