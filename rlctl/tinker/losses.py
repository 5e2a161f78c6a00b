"""Tinker's built-in losses, per token, summed (docs/tinker.md writes the maths out).

Each takes the datum's target log-probs under the current weights, `lp` [N], and its
loss_fn_inputs (each [N]), and returns the per-token loss [N]; the datum's loss is its sum and the
request's loss is the sum over datums: no mean anywhere (the client normalises, e.g. by putting
1 / total_tokens into `weights` or `advantages`). With q the sampler's log-probs (`logprobs`),
A the advantages and r = exp(lp - q):
  cross_entropy        -w * lp                                  (w: any real number, so the SDK's
                                                                 client-side custom losses work)
  importance_sampling  -r * A
  ppo                  -min(r * A, clip(r, lo, hi) * A)           lo, hi = clip_low/high_threshold
  cispo                -sg(clip(r, lo, hi)) * lp * A             sg = stop-gradient
  dro                  -(lp * A - beta / 2 * (lp - q)^2)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from rlctl.tinker.wire import TinkerError

DEFAULT_CLIP = (0.8, 1.2)   # Tinker's clip_low_threshold / clip_high_threshold defaults (ratio 1 -/+ 0.2)
REFUSED = {"stable_reinforce": "its server-side maths is not public, so it cannot be reproduced here; "
                               "use ppo or cispo",
           "gspo": "its sequence-level definition in Tinker is not public; use ppo or cispo",
           "custom": "server-side custom losses are not served; the SDK's forward_backward_custom runs "
                     "them client-side over cross_entropy, which works"}


@dataclass(frozen=True)
class Loss:
    needs: tuple[str, ...]                 # loss_fn_inputs every datum must carry
    params: tuple[str, ...]                # loss_fn_config keys it reads
    fn: Callable[[torch.Tensor, dict, dict], torch.Tensor]


def _ratio(lp: torch.Tensor, x: dict) -> torch.Tensor:
    return torch.exp(lp - x["logprobs"])


def _clip(cfg: dict) -> tuple[float, float]:
    return float(cfg.get("clip_low_threshold", DEFAULT_CLIP[0])), float(cfg.get("clip_high_threshold", DEFAULT_CLIP[1]))


def _cross_entropy(lp, x, cfg):
    return -x["weights"] * lp


def _importance_sampling(lp, x, cfg):
    return -_ratio(lp, x) * x["advantages"]


def _ppo(lp, x, cfg):
    r, adv = _ratio(lp, x), x["advantages"]
    lo, hi = _clip(cfg)
    return -torch.minimum(r * adv, torch.clamp(r, lo, hi) * adv)


def _cispo(lp, x, cfg):
    lo, hi = _clip(cfg)
    return -torch.clamp(_ratio(lp, x), lo, hi).detach() * lp * x["advantages"]


def _dro(lp, x, cfg):
    beta = cfg.get("beta")
    if not isinstance(beta, float):
        raise TinkerError("loss dro needs loss_fn_config={'beta': <float>} (the weight of its quadratic penalty)")
    return -(lp * x["advantages"] - 0.5 * beta * (lp - x["logprobs"]) ** 2)


LOSSES = {
    "cross_entropy": Loss(("target_tokens",), (), _cross_entropy),
    "importance_sampling": Loss(("target_tokens", "logprobs", "advantages"), (), _importance_sampling),
    "ppo": Loss(("target_tokens", "logprobs", "advantages"), ("clip_low_threshold", "clip_high_threshold"), _ppo),
    "cispo": Loss(("target_tokens", "logprobs", "advantages"), ("clip_low_threshold", "clip_high_threshold"), _cispo),
    "dro": Loss(("target_tokens", "logprobs", "advantages"), ("beta",), _dro),
}


def loss_for(name: str, config: dict) -> Loss:
    """The named loss; TinkerError naming what is served for an unknown, refused or misconfigured one."""
    if name in REFUSED:
        raise TinkerError(f"loss_fn {name!r} is not supported by rlctl tinker: {REFUSED[name]}")
    loss = LOSSES.get(name)
    if loss is None:
        raise TinkerError(f"unknown loss_fn {name!r}; rlctl tinker serves {', '.join(LOSSES)}")
    unknown = sorted(set(config) - set(loss.params))
    if unknown:
        takes = ", ".join(loss.params) or "no loss_fn_config"
        raise TinkerError(f"loss_fn {name!r} does not take loss_fn_config key(s) {', '.join(unknown)} (it takes {takes})")
    return loss
