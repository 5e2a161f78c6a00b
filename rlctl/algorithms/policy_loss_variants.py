"""verl's other policy losses, registered under verl's names: sapo, cispo, geo_mean (GMPO),
clip_cov, kl_cov, gpg, dppo_tv, dppo_kl, dro.

Same shapes and conventions as losses.py: [B, T] tensors over response tokens; padding is
zeroed before any arithmetic so junk there changes neither the loss nor its gradient. Knobs
beyond the PPO clip ranges are each loss's params dataclass (set in [actor.loss_params]), with
verl's defaults, and arrive as keyword arguments.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .aggregation import mean_over_sequences
from .functional import masked_mean
from .losses import LOG_RATIO_CLAMP, _valid, _where_valid, weighted_loss
from .registry import AlgorithmError, RequiredParam, get_policy_loss, register_policy_loss


def _inputs(old_log_prob, log_prob, advantages, response_mask):
    """(old, new, advantages) with padding zeroed: safe for exp, products and top-k."""
    return (_where_valid(response_mask, old_log_prob), _where_valid(response_mask, log_prob),
            _where_valid(response_mask, advantages))


def _frac(condition: torch.Tensor, mask: torch.Tensor) -> float:
    return masked_mean(condition.to(torch.float64), mask).item()


@dataclass(frozen=True)
class SapoParams:
    tau_pos: float = 1.0    # gate temperature for tokens with positive advantage
    tau_neg: float = 1.05   # gate temperature for tokens with non-positive advantage

    def __post_init__(self):
        if not (self.tau_pos > 0 and self.tau_neg > 0):
            raise ValueError(f"tau_pos and tau_neg must be > 0, got {self.tau_pos} and {self.tau_neg}")


@register_policy_loss("sapo", loss_agg_mode="seq-mean-token-mean", trust_region=True, params=SapoParams)
def sapo(*, old_log_prob, log_prob, advantages, response_mask, norm, tau_pos, tau_neg, rollout_is_weights=None, **_):
    """SAPO (Gao et al. 2025, arXiv 2511.20347): a smooth sigmoid gate instead of a hard clip.

    r = exp(clamp(log pi - log pi_old, +-20)); tau = tau_pos if A > 0 else tau_neg;
    f(r) = sigmoid(tau (r - 1)) * 4 / tau (slope 1 at r = 1); L = -f(r) A, seq-mean-token-mean.
    """
    old, new, adv = _inputs(old_log_prob, log_prob, advantages, response_mask)
    log_ratio = (new - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    tau = torch.where(adv > 0, torch.as_tensor(tau_pos, dtype=adv.dtype), torch.as_tensor(tau_neg, dtype=adv.dtype))
    gates = torch.sigmoid(tau * (torch.exp(log_ratio) - 1.0)) * (4.0 / tau)
    loss = weighted_loss(-gates * adv, response_mask, "seq-mean-token-mean", norm, rollout_is_weights)
    return loss, {"pg_clipfrac": 0.0, "pg_clipfrac_lower": 0.0,
                  "ppo_kl": masked_mean(-log_ratio.detach(), response_mask).item()}


@register_policy_loss("cispo", open_low=True)
def cispo(*, old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high, loss_agg_mode,
          norm, rollout_is_weights=None, **_):
    """CISPO (MiniMax-M1, arXiv 2506.13585): clip the IS weight, never drop a token's gradient.

    L = -sg[clip(r, 1 - low, 1 + high)] * A * log pi; pg_clipfrac: share of tokens whose r was clipped.
    """
    old, new, adv = _inputs(old_log_prob, log_prob, advantages, response_mask)
    log_ratio = (new - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    clipped = ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high).detach()
    loss = weighted_loss(-clipped * adv * new, response_mask, loss_agg_mode, norm, rollout_is_weights)
    return loss, {"pg_clipfrac": _frac(ratio != clipped, response_mask), "pg_clipfrac_lower": 0.0,
                  "ppo_kl": masked_mean(-log_ratio.detach(), response_mask).item()}


@register_policy_loss("geo_mean", trust_region=True)
def geo_mean(*, old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high, norm,
             rollout_is_weights=None, **_):
    """GMPO (Zhao et al. 2025, arXiv 2507.20673): a geometric mean of token ratios per sequence.

    Per token the log-ratio is clipped to [-low, +high] pessimistically for the sign of A:
    l = sign(A) min(sign(A) d, sign(A) clip(d)); s_i = exp(sum_t l / |y_i|), A_i = mean_t A;
    L = mean_i(-A_i s_i) (a per-sequence loss: loss_agg_mode does not apply). pg_clipfrac /
    pg_clipfrac_lower: share of tokens with d outside the range and A > 0 / A < 0.
    """
    old, new, adv = _inputs(old_log_prob, log_prob, advantages, response_mask)
    mask = _valid(response_mask).to(new.dtype)
    log_ratio = new - old
    sign = torch.sign(adv)
    clamped = log_ratio.clamp(-clip_ratio_low, clip_ratio_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)
    lengths = mask.sum(-1) + 1e-8
    seq_ratio = torch.exp((pessimistic * mask).sum(-1) / lengths)
    seq_adv = (adv * mask).sum(-1) / lengths
    seq_losses = -seq_adv * seq_ratio                                            # [B]
    if rollout_is_weights is not None:   # per sequence: the geometric mean of the token weights
        log_w = torch.log(_where_valid(response_mask, rollout_is_weights.detach().to(new.dtype)) + 1e-10)
        seq_losses = seq_losses * torch.exp((log_w * mask).sum(-1) / lengths)
    loss = mean_over_sequences(seq_losses, norm, max(seq_losses.shape[0], 1))   # every row counts, as in verl
    out_of_range = log_ratio != clamped
    return loss, {"pg_clipfrac": _frac(out_of_range & (adv > 0), response_mask),
                  "pg_clipfrac_lower": _frac(out_of_range & (adv < 0), response_mask),
                  "ppo_kl": masked_mean(-log_ratio.detach(), response_mask).item()}


def _centered_cov(adv: torch.Tensor, log_prob: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per-token (A - mean A)(log pi - mean log pi), means over valid tokens, no gradient."""
    adv, log_prob = adv.detach(), log_prob.detach()
    return (adv - masked_mean(adv, mask)) * (log_prob - masked_mean(log_prob, mask))


def _share(name: str, value: float) -> None:
    if not 0 < value <= 1:
        raise ValueError(f"{name} is a share of tokens: it must be in (0, 1], got {value}")


@dataclass(frozen=True)
class ClipCovParams:
    clip_cov_ratio: float = 0.0002   # share of tokens whose gradient is detached
    clip_cov_lb: float = 1.0         # lower bound of the covariance of detachable tokens
    clip_cov_ub: float = 5.0         # upper bound of the covariance of detachable tokens

    def __post_init__(self):
        _share("clip_cov_ratio", self.clip_cov_ratio)


@register_policy_loss("clip_cov", trust_region=True, params=ClipCovParams)
def clip_cov(*, old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high, loss_agg_mode,
             norm, clip_cov_ratio, clip_cov_lb, clip_cov_ub, rollout_is_weights=None, **_):
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", arXiv 2505.22617).

    PPO clipped loss, plus: among valid, not-already-clipped tokens whose centred covariance
    (A - mean A)(log pi - mean log pi) lies in (lb, ub), max(1, int(ratio * N_valid)) picked at
    random (torch's global RNG) get no gradient. No ratio clamp, as in verl. pg_clipfrac: share picked.
    """
    old, new, adv = _inputs(old_log_prob, log_prob, advantages, response_mask)
    valid = _valid(response_mask)
    ratio = torch.exp(new - old)
    loss1 = -adv * ratio
    loss2 = -adv * ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
    cov = _centered_cov(adv, new, response_mask)
    candidates = valid & ~(loss2 > loss1) & (cov > clip_cov_lb) & (cov < clip_cov_ub)
    positions = torch.nonzero(candidates)
    count = max(int(clip_cov_ratio * valid.sum().item()), 1)
    picked = positions[torch.randperm(len(positions))[:count]] if len(positions) else positions
    keep = torch.ones_like(adv)
    keep[picked[:, 0], picked[:, 1]] = 0
    loss = weighted_loss(torch.maximum(loss1, loss2) * keep, response_mask, loss_agg_mode, norm, rollout_is_weights)
    return loss, {"pg_clipfrac": _frac(keep == 0, response_mask),
                  "ppo_kl": masked_mean(-(new - old).detach(), response_mask).item()}


@dataclass(frozen=True)
class KlCovParams:
    kl_cov_ratio: float = 0.0002   # share of tokens (highest covariance) given the KL penalty
    ppo_kl_coef: float = 0.1       # coefficient of the |log ratio| penalty

    def __post_init__(self):
        _share("kl_cov_ratio", self.kl_cov_ratio)
        if self.ppo_kl_coef < 0:
            raise ValueError(f"ppo_kl_coef must be >= 0, got {self.ppo_kl_coef}")


@register_policy_loss("kl_cov", trust_region=True, params=KlCovParams)
def kl_cov(*, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, norm, kl_cov_ratio, ppo_kl_coef,
           rollout_is_weights=None, **_):
    """KL-Cov (same paper as Clip-Cov): an |log r| penalty on the highest-covariance tokens.

    L = -A r everywhere (no clip); on the top max(1, int(ratio * N_valid)) valid tokens by centred
    covariance L = -A r + ppo_kl_coef |log r|. ppo_kl here is the mean |log r| (as verl logs it).
    """
    old, new, adv = _inputs(old_log_prob, log_prob, advantages, response_mask)
    valid = _valid(response_mask)
    log_ratio = new - old
    losses = -adv * torch.exp(log_ratio)
    n_valid = int(valid.sum().item())
    if n_valid:
        cov = _centered_cov(adv, new, response_mask).masked_fill(~valid, -torch.inf)
        top = torch.topk(cov.reshape(-1), max(1, int(n_valid * kl_cov_ratio))).indices
        penalised = torch.zeros(valid.numel(), dtype=torch.bool, device=valid.device)
        penalised[top] = True
        losses = torch.where(penalised.view_as(valid), losses + ppo_kl_coef * log_ratio.abs(), losses)
    loss = weighted_loss(losses, response_mask, loss_agg_mode, norm, rollout_is_weights)
    return loss, {"ppo_kl": masked_mean(log_ratio.detach().abs(), response_mask).item()}


@register_policy_loss("gpg")
def gpg(*, log_prob, advantages, response_mask, loss_agg_mode, norm, rollout_is_weights=None, **_):
    """GPG (Chu et al. 2025, arXiv 2504.02546): plain policy gradient, L = -A log pi, no ratio."""
    new, adv = _where_valid(response_mask, log_prob), _where_valid(response_mask, advantages)
    return weighted_loss(-new * adv, response_mask, loss_agg_mode, norm, rollout_is_weights), {}


def _dppo(old, new, adv, response_mask, valid_mask, clip_ratio_c, loss_agg_mode, norm, rollout_is_weights):
    """Shared DPPO tail: L = -A sg[min(r, c)] log pi on tokens inside the trust region."""
    log_ratio = (new - old).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    keep = valid_mask.detach().to(new.dtype)
    loss = weighted_loss(-adv * ratio.clamp(max=clip_ratio_c).detach() * new * keep, response_mask, loss_agg_mode,
                         norm, rollout_is_weights)
    return loss, {"pg_clipfrac": _frac(keep == 0, response_mask),
                  "pg_clipfrac_lower": _frac((ratio > clip_ratio_c) & (keep > 0), response_mask),
                  "ppo_kl": masked_mean(-log_ratio.detach(), response_mask).item()}


@register_policy_loss("dppo_tv", trust_region=True)
def dppo_tv(*, old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high, clip_ratio_c,
            loss_agg_mode, norm, rollout_is_weights=None, **_):
    """DPPO-Binary-TV (arXiv 2602.04879): a trust region on the sampled token's probability.

    clip_ratio_low/high are total-variation thresholds here, not ratio ranges: a token with A > 0
    trains while pi - pi_old <= high, with A <= 0 while pi - pi_old >= -low. clip_ratio_c truncates
    the (detached) IS weight. pg_clipfrac: share masked out; pg_clipfrac_lower: share truncated.
    """
    old, new, adv = _inputs(old_log_prob, log_prob, advantages, response_mask)
    delta = torch.exp(new) - torch.exp(old)
    inside = torch.where(adv > 0, delta <= clip_ratio_high, delta >= -clip_ratio_low)
    return _dppo(old, new, adv, response_mask, inside, clip_ratio_c, loss_agg_mode, norm, rollout_is_weights)


@register_policy_loss("dppo_kl", trust_region=True)
def dppo_kl(*, old_log_prob, log_prob, advantages, response_mask, clip_ratio_low, clip_ratio_high, clip_ratio_c,
            loss_agg_mode, norm, rollout_is_weights=None, **_):
    """DPPO-Binary-KL (arXiv 2602.04879): the trust region is a Bernoulli KL on the sampled token.

    KL = p_old log(p_old / p) + (1 - p_old) log((1 - p_old + 1e-8) / (1 - p + 1e-8)); A > 0 trains
    while KL <= high or p <= p_old, A <= 0 while KL <= low or p >= p_old. Rest as dppo_tv.
    """
    old, new, adv = _inputs(old_log_prob, log_prob, advantages, response_mask)
    p, p_old = torch.exp(new), torch.exp(old)
    binary_kl = p_old * (old - new) + (1 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))
    inside = torch.where(adv > 0, (binary_kl <= clip_ratio_high) | (p <= p_old),
                         (binary_kl <= clip_ratio_low) | (p >= p_old))
    return _dppo(old, new, adv, response_mask, inside, clip_ratio_c, loss_agg_mode, norm, rollout_is_weights)


@dataclass(frozen=True)
class DroParams:
    dro_beta: float = 0.0   # weight of the quadratic penalty; 0 = unset (verl has no default): must be set > 0

    def __post_init__(self):
        if self.dro_beta < 0:
            raise ValueError(f"dro_beta must be > 0, got {self.dro_beta}")


@register_policy_loss("dro", trust_region=True, params=DroParams,
                      required=(RequiredParam("dro_beta", "weighs its quadratic penalty by dro_beta", 0.1),))
def dro(*, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, norm, dro_beta, rollout_is_weights=None,
        **_):
    """DRO (verl docs/algo/dro.md, Direct Reward Optimization): a quadratic proximal penalty
    instead of a clip. L = -(A log pi - beta/2 (log pi - log pi_old)^2), aggregated by
    loss_agg_mode; d/dlog pi = -A + beta (log pi - log pi_old). No ratio, so no clamp: the
    log-ratio enters squared, unclamped, as in verl. beta (dro_beta) has no default in verl.
    """
    if dro_beta is None or not dro_beta > 0:
        raise AlgorithmError(f"dro needs a positive dro_beta (the quadratic penalty's weight), got {dro_beta}")
    old, new, adv = _inputs(old_log_prob, log_prob, advantages, response_mask)
    log_ratio = new - old
    losses = -(new * adv - 0.5 * dro_beta * log_ratio.square())
    loss = weighted_loss(losses, response_mask, loss_agg_mode, norm, rollout_is_weights)
    return loss, {"ppo_kl": masked_mean(-log_ratio.detach(), response_mask).item()}


def bypass_policy_loss(*, rollout_log_prob, log_prob, advantages, response_mask, loss_type="ppo_clip",
                       rollout_is="", rollout_is_threshold=2.0, rollout_is_batch_normalize=False, rollout_rs="",
                       rollout_rs_threshold="", clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0,
                       loss_agg_mode="token-mean", norm=None):
    """verl's bypass mode (compute_policy_loss_bypass_mode): old_log_prob is the rollout's own
    log-prob, never recomputed. Rollout correction runs here, per micro-batch, between the current
    policy (detached) and the rollout: its rejection mask replaces response_mask, then
      loss_type "ppo_clip":  the vanilla PPO loss with ratio pi / pi_rollout (the clip bounds it;
                             the IS weights are not applied, only logged),
      loss_type "reinforce": -sg[w] A log pi with the truncated IS weights w (gpg's loss), plus
                             ppo_kl = mean(log pi_rollout - log pi).
    Returns (loss, metrics) with the rollout_corr/* metrics merged in, as verl does.
    """
    from .rollout_correction import rollout_correction

    if loss_type not in ("ppo_clip", "reinforce"):
        raise AlgorithmError(f"loss_type must be \"ppo_clip\" or \"reinforce\", got {loss_type!r}")
    weights, metrics, mask = None, {}, response_mask
    if bool(_valid(response_mask).any()):
        with torch.no_grad():
            weights, new_mask, metrics = rollout_correction(   # it zeroes the padding itself
                log_prob.detach(), rollout_log_prob, response_mask, rollout_is=rollout_is,
                rollout_is_threshold=rollout_is_threshold, rollout_is_batch_normalize=rollout_is_batch_normalize,
                rollout_rs=rollout_rs, rollout_rs_threshold=rollout_rs_threshold)
        mask = new_mask.to(response_mask.dtype) if rollout_rs else response_mask
    common = dict(old_log_prob=rollout_log_prob, log_prob=log_prob, advantages=advantages, response_mask=mask,
                  clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high, clip_ratio_c=clip_ratio_c,
                  loss_agg_mode=loss_agg_mode, norm=norm)
    if loss_type == "ppo_clip":
        loss, pg_metrics = get_policy_loss("vanilla").fn(**common)
    else:
        loss, pg_metrics = get_policy_loss("gpg").fn(**common, rollout_is_weights=weights)
        old, new = _where_valid(mask, rollout_log_prob), _where_valid(mask, log_prob.detach())
        pg_metrics = {"ppo_kl": masked_mean(old - new, mask).item() if bool(_valid(mask).any()) else 0.0}
    return loss, {**pg_metrics, **metrics}
