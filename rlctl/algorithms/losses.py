"""Policy losses (registered by name) and the clipped value loss.

Shapes: old_log_prob, log_prob, advantages, response_mask, vpreds, returns, values are [B, T]
over response tokens. Losses are scalars ready for backward; metrics are plain floats (means over
this batch's valid tokens), named as the loop logs them under `actor/` or `critic/`.
"""

from __future__ import annotations

import torch

from .aggregation import LossNorm, aggregate_loss
from .functional import masked_mean
from .registry import AlgorithmError, get_policy_loss, register_policy_loss

LOG_RATIO_CLAMP = 20.0  # |log pi/pi_old| cap before exp: ratio stays in [2e-9, 4.9e8], never inf


def policy_loss(name: str = "vanilla", *, old_log_prob: torch.Tensor, log_prob: torch.Tensor,
                advantages: torch.Tensor, response_mask: torch.Tensor, clip_ratio_low: float = 0.2,
                clip_ratio_high: float = 0.2, clip_ratio_c: float = 3.0, loss_agg_mode: str = "token-mean",
                norm: LossNorm | None = None, **knobs) -> tuple[torch.Tensor, dict]:
    """The policy loss registered as `name`: returns (loss, {pg_clipfrac, pg_clipfrac_lower, ppo_kl}).

    knobs: loss-specific settings passed through by name (tau_pos, tau_neg, clip_cov_ratio, ...:
    see policy_loss_variants.py); a loss ignores those it does not read. rollout_is_weights [B, T] (rollout
    correction) multiplies every loss's per-token terms.
    `norm` carries mini-batch counts for micro-batch accumulation (see aggregate_loss). A loss
    registered with a fixed loss_agg_mode (GSPO: seq-mean-token-mean) ignores `loss_agg_mode`.
    """
    spec = get_policy_loss(name)
    for what, x in (("old_log_prob", old_log_prob), ("log_prob", log_prob), ("advantages", advantages)):
        if not isinstance(x, torch.Tensor) or x.shape != response_mask.shape:
            raise AlgorithmError(f"{what} must be a tensor shaped like response_mask {tuple(response_mask.shape)}, "
                                 f"got {getattr(x, 'shape', type(x).__name__)}")
    if not clip_ratio_c > 1.0:
        raise AlgorithmError(f"clip_ratio_c must be > 1 (dual-clip bound), got {clip_ratio_c}")
    return spec.fn(old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages,
                   response_mask=response_mask, clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high,
                   clip_ratio_c=clip_ratio_c, loss_agg_mode=spec.loss_agg_mode or loss_agg_mode, norm=norm,
                   **knobs)


def weighted_loss(pg_losses: torch.Tensor, mask: torch.Tensor, mode: str, norm: LossNorm | None,
                  rollout_is_weights) -> torch.Tensor:
    """aggregate_loss of the per-token losses [B, T] times the rollout-correction IS weights [B, T]
    (detached; None = no correction): the last step of every token-level policy loss."""
    if rollout_is_weights is not None:
        pg_losses = pg_losses * _where_valid(mask, rollout_is_weights.detach().to(pg_losses.dtype))
    return aggregate_loss(pg_losses, mask, mode, norm=norm)


def _valid(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def _where_valid(mask: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    # Padding may hold -inf log-probs or junk advantages; replace before any arithmetic so
    # neither the loss nor its gradient can become NaN.
    return torch.where(_valid(mask), x, torch.zeros((), dtype=x.dtype, device=x.device))


@register_policy_loss("vanilla", clip_higher=True, bypass_loss=True, trust_region=True)
def vanilla(*, old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high,
            clip_ratio_c, loss_agg_mode, norm, rollout_is_weights=None, **_):
    """PPO clipped surrogate with asymmetric clip (DAPO clip-higher) and dual-clip.

    r = exp(clamp(log_prob - old_log_prob, +-20)); L1 = -A r; L2 = -A clip(r, 1 - low, 1 + high);
    L = max(L1, L2), and for A < 0 additionally min(L, -A c) (dual-clip bounds the loss of a
    negative-advantage token whose ratio exploded). pg_clipfrac: share of tokens where L2 > L1;
    pg_clipfrac_lower: share where the dual clip bound; ppo_kl = mean(old_log_prob - log_prob).
    """
    advantages = _where_valid(response_mask, advantages)
    log_ratio = _where_valid(response_mask, log_prob - old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    pg_losses, metrics = dual_clip_surrogate(advantages, log_ratio, response_mask, clip_ratio_low, clip_ratio_high,
                                             clip_ratio_c)
    return weighted_loss(pg_losses, response_mask, loss_agg_mode, norm, rollout_is_weights), metrics


def dual_clip_surrogate(advantages, log_ratio, response_mask, clip_ratio_low, clip_ratio_high, clip_ratio_c):
    """Per-token PPO losses [B, T] from log r = log pi - log pi_old (padding zeroed, clamped):
    max(-A r, -A clip(r, 1 - low, 1 + high)), for A < 0 at most -A c; and vanilla's metrics."""
    ratio = torch.exp(log_ratio)
    loss1 = -advantages * ratio
    loss2 = -advantages * ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    clipped = torch.maximum(loss1, loss2)
    loss3 = -advantages * clip_ratio_c
    negative = advantages < 0
    pg_losses = torch.where(negative, torch.minimum(clipped, loss3), clipped)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((loss2 > loss1).to(ratio.dtype), response_mask).item(),
            "pg_clipfrac_lower": masked_mean(((clipped > loss3) & negative).to(ratio.dtype), response_mask).item(),
            "ppo_kl": masked_mean(-log_ratio, response_mask).item(),
        }
    return pg_losses, metrics


@register_policy_loss("gspo", loss_agg_mode="seq-mean-token-mean", trust_region=True)
def gspo(*, old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high, norm,
         rollout_is_weights=None, **_):
    """GSPO (Zheng et al. 2025): a sequence-level ratio s_i = exp(mean_t log(pi/pi_old)).

    Per token the ratio is sg[s_i] * pi_t / sg[pi_t] (value s_i; gradient s_i * grad log pi_t),
    log-clamped above at 10; L = max(-A s, -A clip(s, 1 - low, 1 + high)), aggregated
    seq-mean-token-mean. No dual-clip: pg_clipfrac_lower is 0.
    """
    valid = _valid(response_mask)
    advantages = _where_valid(response_mask, advantages)
    log_ratio = _where_valid(response_mask, log_prob - old_log_prob)
    seq_log_ratio = log_ratio.sum(-1) / valid.sum(-1).clamp(min=1).to(log_ratio.dtype)   # [B]
    safe_log_prob = _where_valid(response_mask, log_prob)
    log_seq_ratio = safe_log_prob - safe_log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    seq_ratio = torch.exp(log_seq_ratio.clamp(max=10.0))
    loss1 = -advantages * seq_ratio
    loss2 = -advantages * seq_ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    loss = weighted_loss(torch.maximum(loss1, loss2), response_mask, "seq-mean-token-mean", norm, rollout_is_weights)
    with torch.no_grad():
        metrics = {
            "pg_clipfrac": masked_mean((loss2 > loss1).to(seq_ratio.dtype), response_mask).item(),
            "pg_clipfrac_lower": 0.0,
            "ppo_kl": masked_mean(-log_ratio, response_mask).item(),
        }
    return loss, metrics


def value_loss(*, vpreds: torch.Tensor, returns: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor,
               value_clip: float, loss_agg_mode: str = "token-mean",
               norm: LossNorm | None = None) -> tuple[torch.Tensor, dict]:
    """PPO clipped value loss: 0.5 * agg(max((v - R)^2, (clip(v, V_old +- value_clip) - R)^2)).

    vpreds: the critic now; values: the critic at rollout time; returns: GAE targets.
    Metrics: vf_clipfrac (share of tokens where the clipped term is larger), vpred_mean.
    """
    for what, x in (("vpreds", vpreds), ("returns", returns), ("values", values)):
        if not isinstance(x, torch.Tensor) or x.shape != response_mask.shape:
            raise AlgorithmError(f"{what} must be a tensor shaped like response_mask {tuple(response_mask.shape)}")
    if not value_clip > 0:
        raise AlgorithmError(f"value_clip must be > 0, got {value_clip}")
    returns, values = _where_valid(response_mask, returns), _where_valid(response_mask, values)
    vpreds = _where_valid(response_mask, vpreds)
    clipped = torch.maximum(torch.minimum(vpreds, values + value_clip), values - value_clip)
    loss1 = (vpreds - returns) ** 2
    loss2 = (clipped - returns) ** 2
    loss = 0.5 * aggregate_loss(torch.maximum(loss1, loss2), response_mask, loss_agg_mode, norm=norm)
    with torch.no_grad():
        metrics = {
            "vf_clipfrac": masked_mean((loss2 > loss1).to(loss1.dtype), response_mask).item(),
            "vpred_mean": masked_mean(vpreds, response_mask).item(),
        }
    return loss, metrics
