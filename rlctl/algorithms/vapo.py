"""VAPO (Yue et al. 2025, arXiv 2504.05118): value-model PPO for long reasoning, its two pure parts.

The estimator `vapo` is decoupled, length-adaptive GAE. The critic's targets use lam_critic
(1.0: the Monte-Carlo return, unbiased whatever the value model says), the actor's advantages a
per-sequence lam_policy = 1 - 1 / (alpha * l), l the response length, clamped to [0, 1]: a long
response needs a lam near 1 for the terminal reward to reach its first tokens, a short one less.
The loss `vapo` is PPO's clipped surrogate plus the positive-example LM loss: mu x the mean NLL over
the tokens of the responses whose `acc` is > 0 (correct ones), which keeps imitating what worked.
The rest of VAPO is configuration: clip-higher (0.2 / 0.28), token-mean, rollout.n > 1, and the
critic's value pretraining (critic.pretrain_steps).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .advantages import gae_advantages
from .aggregation import LossNorm, aggregate_loss
from .functional import masked_whiten
from .losses import vanilla
from .registry import register_estimator, register_policy_loss


def length_adaptive_lam(lengths: torch.Tensor, alpha: float) -> torch.Tensor:
    """lam_policy [B] = 1 - 1 / (alpha * l), clamped to [0, 1] (l = 0 gives 0)."""
    lengths = lengths.to(torch.float64)
    lam = 1.0 - 1.0 / (alpha * lengths).clamp(min=1e-12)
    return lam.clamp(0.0, 1.0)


@dataclass(frozen=True)
class VapoParams:
    lam_critic: float = 1.0   # the critic's GAE lambda (1.0: Monte-Carlo returns)
    alpha: float = 0.05       # length-adaptive lam_policy = 1 - 1 / (alpha * l); 0 = use algorithm.lam

    def __post_init__(self):
        if not 0 <= self.lam_critic <= 1:
            raise ValueError(f"lam_critic must be in [0, 1], got {self.lam_critic}")
        if self.alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {self.alpha}")


@register_estimator("vapo", reads=("values",), params=VapoParams)
def vapo_advantages(*, token_level_rewards, values, response_mask, gamma, lam, lam_critic, alpha, **_):
    """Decoupled, length-adaptive GAE: returns = GAE(lam_critic) + V (the critic's targets), advantages =
    GAE(lam_policy) whitened over the batch's valid tokens; lam_policy per row from its length, or
    algorithm.lam when alpha = 0."""
    lam_policy = length_adaptive_lam(response_mask.sum(-1), alpha).to(values.dtype) if alpha > 0 else lam
    returns = gae_advantages(token_level_rewards, values, response_mask, gamma, lam_critic) + values
    advantages = gae_advantages(token_level_rewards, values, response_mask, gamma, lam_policy)
    return masked_whiten(advantages, response_mask), returns


NLL_NORMS = ("correct_tokens", "all_tokens")


@dataclass(frozen=True)
class VapoLossParams:
    nll_coef: float = 0.1     # mu: weight of the NLL over the correct responses' tokens
    # correct_tokens: the paper's mean over the correct responses' tokens (mu keeps its weight
    # whatever the share of correct answers); all_tokens: aggregated like the PPO term over every
    # response token, incorrect rows counting 0 (rlctl before; mu shrinks with that share)
    nll_norm: str = "correct_tokens"

    def __post_init__(self):
        if self.nll_coef < 0:
            raise ValueError(f"nll_coef must be >= 0, got {self.nll_coef}")
        if self.nll_norm not in NLL_NORMS:
            raise ValueError(f"nll_norm must be one of {', '.join(NLL_NORMS)}, got {self.nll_norm!r}")


@register_policy_loss("vapo", clip_higher=True, trust_region=True, params=VapoLossParams, reads=("acc",))
def vapo_loss(*, log_prob, response_mask, loss_agg_mode, norm, nll_coef, nll_norm, acc, **inputs):
    """L = L_PPO (vanilla: clip-higher, dual-clip) + mu x NLL over the tokens of rows with acc > 0.
    nll_norm "correct_tokens" (VAPO's eq.): NLL = -sum_{i correct, t} log pi / (tokens of the correct
    rows of the mini-batch: norm.correct_tokens, else this batch's own); "all_tokens": the NLL
    aggregated like the PPO term (loss_agg_mode), other rows counting 0. mu = 0 is plain PPO."""
    loss, metrics = vanilla(log_prob=log_prob, response_mask=response_mask, loss_agg_mode=loss_agg_mode,
                            norm=norm, **inputs)
    positive = response_mask * (acc > 0).to(response_mask.dtype).unsqueeze(-1)
    safe = torch.where(positive > 0, log_prob, torch.zeros((), dtype=log_prob.dtype, device=log_prob.device))
    if nll_norm == "all_tokens":
        nll = aggregate_loss(-safe, response_mask, loss_agg_mode, norm=norm)
    else:
        counted = norm.correct_tokens if norm is not None and norm.correct_tokens is not None else None
        mini = LossNorm(tokens=counted, dp_size=norm.dp_size if norm is not None else 1)
        nll = aggregate_loss(-safe, positive, "token-mean", norm=mini)
    metrics = {**metrics, "nll_loss": float(nll.detach()),
               "nll_positive_frac": float((acc > 0).to(torch.float64).mean()) if acc.numel() else 0.0}
    return loss + nll_coef * nll if nll_coef else loss, metrics
