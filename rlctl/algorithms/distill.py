"""On-policy distillation (OPD): the student samples, a frozen teacher scores the student's own
tokens, and the student is pushed toward the teacher token by token.

Shapes: log_prob / teacher_log_prob [B, T] are the student's and the teacher's log-probs of the
sampled response tokens (temperature 1); topk_log_prob / teacher_topk_log_prob [B, T, K] are both
models' log-probs of the teacher's K most likely next tokens at each response position.

Two kinds of loss, registered by name (`register_distill_loss`; duplicates are refused):

  policy-gradient ("k1"): the per-token advantage A_t = -(log p_s(x_t) - log p_t(x_t)), the
      negated k1 estimate of KL(p_s || p_t) at the sampled token, trained through the policy loss
      (so clipping and rollout correction apply). Its expected gradient,
      E_{x~p_s}[-(log p_s(x) - log p_t(x)) grad log p_s(x)], is exactly -grad KL(p_s || p_t).
  supervised ("k3", "forward_kl_topk", "jsd"): a per-token loss differentiated directly,
      added to the policy loss with distill.coef.
      k3:               verl's low_var_kl with the teacher as reference, exp(l_t - l_s) - (l_t - l_s) - 1.
      forward_kl_topk:  KL(p_t || p_s) over the teacher's top-k tokens plus one "rest" bucket
                        (1 - the k probabilities), so it is a true KL of two distributions: zero,
                        with zero gradient, when the student equals the teacher, and it pushes mass
                        onto the top-k (a plain truncated sum would not). With k = vocabulary it is
                        the full forward KL.
      jsd:              TRL's generalised JSD (GKD, Agarwal et al. 2024) on the same k + 1 buckets:
                        beta KL(p_t || m) + (1 - beta) KL(p_s || m), m = beta p_t + (1 - beta) p_s;
                        beta = 0 is KL(p_t || p_s) and beta = 1 is KL(p_s || p_t), as in TRL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .aggregation import aggregate_loss
from .functional import masked_mean
from .kl import kl_penalty
from .registry import AlgorithmError

EPS = 1e-12   # floor of a bucket's probability under a log (its own weight is then ~0)


@dataclass(frozen=True)
class DistillLossSpec:
    name: str
    fn: Callable
    policy_gradient: bool   # True: fn gives per-token advantages; False: a per-token loss to minimise
    needs_topk: bool        # the teacher's top-k log-probs (and the student's at those ids)


_DISTILL_LOSSES: dict[str, DistillLossSpec] = {}


def register_distill_loss(name: str, *, policy_gradient: bool = False, needs_topk: bool = False) -> Callable:
    """Register fn(**tensors, beta) -> [B, T] under `name`; a second registration of a name is an error."""
    def decorator(fn: Callable) -> Callable:
        if name in _DISTILL_LOSSES:
            raise AlgorithmError(f"distillation loss {name!r} is already registered")
        _DISTILL_LOSSES[name] = DistillLossSpec(name, fn, policy_gradient, needs_topk)
        return fn

    return decorator


def get_distill_loss(name: str) -> DistillLossSpec:
    if name not in _DISTILL_LOSSES:
        raise AlgorithmError(f"unknown distillation loss {name!r}: use one of {', '.join(distill_loss_names())}")
    return _DISTILL_LOSSES[name]


def distill_loss_names() -> tuple[str, ...]:
    return tuple(_DISTILL_LOSSES)


@register_distill_loss("k1", policy_gradient=True)
def k1_advantages(*, log_prob: torch.Tensor, teacher_log_prob: torch.Tensor, **_) -> torch.Tensor:
    """A_t = -(log p_s - log p_t) [B, T], no gradient (it is an advantage)."""
    return -(log_prob - teacher_log_prob).detach()


@register_distill_loss("k3")
def k3_loss(*, log_prob: torch.Tensor, teacher_log_prob: torch.Tensor, response_mask: torch.Tensor,
            **_) -> torch.Tensor:
    """verl's low_var_kl with the teacher in the reference's place (clamped as verl does)."""
    return kl_penalty(log_prob, teacher_log_prob, "low_var_kl", response_mask=response_mask)


def _buckets(topk_log_prob: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., K] log-probs -> (probabilities [..., K + 1] with the rest bucket last, their logs)."""
    probs = topk_log_prob.exp()
    rest = (1.0 - probs.sum(-1, keepdim=True)).clamp_min(0.0)
    return torch.cat([probs, rest], -1), torch.cat([topk_log_prob, rest.clamp_min(EPS).log()], -1)


def _kl(p: torch.Tensor, log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) over the last dim; a bucket with p = 0 adds 0 (and no gradient)."""
    return torch.where(p > 0, p * (log_p - log_q), torch.zeros_like(p)).sum(-1)


@register_distill_loss("forward_kl_topk", needs_topk=True)
def forward_kl_topk_loss(*, topk_log_prob: torch.Tensor, teacher_topk_log_prob: torch.Tensor, **_) -> torch.Tensor:
    """KL(p_t || p_s) over the teacher's top-k + rest [B, T]."""
    q, log_q = _buckets(teacher_topk_log_prob.detach())
    _, log_p = _buckets(topk_log_prob)
    return _kl(q, log_q, log_p)


@register_distill_loss("jsd", needs_topk=True)
def jsd_loss(*, topk_log_prob: torch.Tensor, teacher_topk_log_prob: torch.Tensor, beta: float = 0.5,
             **_) -> torch.Tensor:
    """Generalised JSD(beta) over the teacher's top-k + rest [B, T] (TRL's convention for beta)."""
    q, log_q = _buckets(teacher_topk_log_prob.detach())
    p, log_p = _buckets(topk_log_prob)
    if beta == 0:
        return _kl(q, log_q, log_p)
    if beta == 1:
        return _kl(p, log_p, log_q)
    m = beta * q + (1 - beta) * p
    log_m = m.clamp_min(EPS).log()
    return beta * _kl(q, log_q, log_m) + (1 - beta) * _kl(p, log_p, log_m)


def distill_advantages(name: str, *, log_prob: torch.Tensor, teacher_log_prob: torch.Tensor,
                       response_mask: torch.Tensor, coef: float = 1.0) -> torch.Tensor:
    """coef x the policy-gradient form's per-token advantages [B, T], 0 on padding."""
    spec = get_distill_loss(name)
    if not spec.policy_gradient:
        raise AlgorithmError(f"distillation loss {name!r} is a supervised loss, not a policy-gradient form")
    adv = spec.fn(log_prob=log_prob, teacher_log_prob=teacher_log_prob)
    return coef * torch.where(response_mask != 0, adv, torch.zeros_like(adv))


def distill_loss(name: str, *, response_mask: torch.Tensor, log_prob: torch.Tensor | None = None,
                 teacher_log_prob: torch.Tensor | None = None, topk_log_prob: torch.Tensor | None = None,
                 teacher_topk_log_prob: torch.Tensor | None = None, beta: float = 0.5,
                 loss_agg_mode: str = "token-mean", norm=None) -> tuple[torch.Tensor, dict]:
    """A supervised form's loss (a scalar, aggregated like the policy loss) and its metrics."""
    spec = get_distill_loss(name)
    if spec.policy_gradient:
        raise AlgorithmError(f"distillation loss {name!r} is the policy-gradient form: use distill_advantages")
    per_token = spec.fn(log_prob=log_prob, teacher_log_prob=teacher_log_prob, response_mask=response_mask,
                        topk_log_prob=topk_log_prob, teacher_topk_log_prob=teacher_topk_log_prob, beta=beta)
    per_token = torch.where(response_mask != 0, per_token, torch.zeros_like(per_token))
    loss = aggregate_loss(per_token, response_mask, loss_agg_mode, norm=norm)
    return loss, {"distill_loss": float(masked_mean(per_token.detach(), response_mask))}


def distill_stats(*, log_prob: torch.Tensor, teacher_log_prob: torch.Tensor, response_mask: torch.Tensor,
                  in_teacher_topk: torch.Tensor) -> dict[str, float]:
    """rkl: mean log p_s - log p_t over response tokens (k1 estimate of KL(p_s || p_t) per token);
    teacher_mass: mean teacher probability of the student's sampled tokens;
    overlap: share of sampled tokens inside the teacher's top-k (in_teacher_topk [B, T] bool)."""
    mask = response_mask.float()
    if not bool(mask.any()):
        return {}
    return {"rkl": float(masked_mean(log_prob - teacher_log_prob, mask)),
            "teacher_mass": float(masked_mean(teacher_log_prob.exp(), mask)),
            "overlap": float(masked_mean(in_teacher_topk.float(), mask))}
