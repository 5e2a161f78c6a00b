"""KL estimators between the actor and the reference policy, and the KL-coefficient controllers.

Estimators follow Schulman's "Approximating KL divergence" note, per token, with
log_ratio = logprob - ref_logprob (samples come from the actor):
  k1 / kl:         log_ratio                         (unbiased, high variance, can be < 0)
  abs:             |log_ratio|
  k2 / mse:        0.5 * log_ratio^2
  k3 / low_var_kl: exp(-log_ratio) + log_ratio - 1   (unbiased, >= 0), with verl's clamps:
                   -log_ratio to [-20, 20] before exp, the result to [-10, 10].
The same estimator serves KL-in-reward (on old_log_prob, no grad) and KL-as-loss (on log_prob).
A "+" after a kind (k1+, k3+, low_var_kl+, ...) is verl's straight-through variant: the value of
that estimator with the gradient of k2, whose expected gradient is the true KL gradient
(k1's and k3's values are unbiased for KL but their gradients are not).
"""

from __future__ import annotations

import torch

from .functional import masked_mean
from .registry import AlgorithmError

_BASE_KINDS = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl")
KL_KINDS = _BASE_KINDS + tuple(f"{k}+" for k in _BASE_KINDS)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str,
               response_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token KL estimate [B, T] from log-probs [B, T] of the sampled tokens.

    response_mask (optional, [B, T]): padded positions are set to 0 *before* the estimate, so
    whatever lies there (garbage, inf) yields 0 and no NaN gradient (a square of inf masked
    afterwards still back-propagates inf * 0 = NaN)."""
    if response_mask is not None:
        valid = response_mask if response_mask.dtype == torch.bool else response_mask != 0
        zero = torch.zeros((), dtype=logprob.dtype, device=logprob.device)
        logprob, ref_logprob = torch.where(valid, logprob, zero), torch.where(valid, ref_logprob, zero)
    if kind.endswith("+") and kind[:-1] in _BASE_KINDS:
        value = _estimate(logprob, ref_logprob, kind[:-1])
        k2 = 0.5 * (logprob - ref_logprob).square()
        return k2 - k2.detach() + value.detach()
    return _estimate(logprob, ref_logprob, kind)


def _estimate(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str) -> torch.Tensor:
    if kind in ("k1", "kl"):
        return logprob - ref_logprob
    if kind == "abs":
        return (logprob - ref_logprob).abs()
    if kind in ("k2", "mse"):
        return 0.5 * (logprob - ref_logprob).square()
    if kind in ("k3", "low_var_kl"):
        neg_log_ratio = (ref_logprob - logprob).clamp(-20.0, 20.0)
        return (torch.exp(neg_log_ratio) - neg_log_ratio - 1).clamp(-10.0, 10.0)
    raise AlgorithmError(f"unknown KL kind {kind!r}: use one of {', '.join(KL_KINDS)}")


def apply_kl_in_reward(token_level_scores: torch.Tensor, *, old_log_prob: torch.Tensor,
                       ref_log_prob: torch.Tensor, response_mask: torch.Tensor, kl_coef: float,
                       kind: str = "kl") -> tuple[torch.Tensor, float]:
    """token_level_rewards = scores - kl_coef * KL per valid token (verl's apply_kl_penalty).

    Returns (token_level_rewards [B, T], current_kl): current_kl is the batch mean of each
    sequence's token-mean KL, which is what the adaptive controller is updated with.
    """
    valid = response_mask if response_mask.dtype == torch.bool else response_mask != 0
    kld = torch.where(valid, kl_penalty(old_log_prob, ref_log_prob, kind, response_mask=valid),
                      torch.zeros((), dtype=old_log_prob.dtype, device=old_log_prob.device))
    rewards = token_level_scores - kl_coef * kld
    current_kl = masked_mean(kld, response_mask, dim=-1).mean().item()
    return rewards, current_kl


class FixedKLController:
    """A constant KL coefficient; `update` does nothing."""

    kind = "fixed"

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        pass

    def state_dict(self) -> dict:
        return {"kind": self.kind, "value": self.value}

    def load_state_dict(self, state: dict) -> None:
        _check_kind(self.kind, state)
        self.value = float(state["value"])


class AdaptiveKLController:
    """Ziegler et al. 2019 (as in TRL/verl): steer the coefficient towards a target KL.

    e = clip(current_kl / target - 1, -0.2, 0.2); value *= 1 + e * n_steps / horizon, where
    n_steps is the number of sequences in the batch and horizon is in sequences too.
    """

    kind = "adaptive"

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        if not target_kl > 0 or not horizon > 0:
            raise AlgorithmError(f"adaptive KL needs target_kl > 0 and horizon > 0, got {target_kl}, {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        error = min(max(float(current_kl) / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict:
        return {"kind": self.kind, "value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict) -> None:
        _check_kind(self.kind, state)
        self.value, self.target, self.horizon = float(state["value"]), float(state["target"]), int(state["horizon"])


def _check_kind(kind: str, state: dict) -> None:
    if state.get("kind") != kind:
        raise AlgorithmError(f"KL controller state is for {state.get('kind')!r}, not {kind!r}: "
                             f"the checkpoint was written with another algorithm.kl_ctrl")


def make_kl_controller(kind: str, *, kl_coef: float, target_kl: float | None = None,
                       horizon: int | None = None):
    """'fixed' -> FixedKLController(kl_coef); 'adaptive' -> AdaptiveKLController(kl_coef, target_kl, horizon)."""
    if kind == "fixed":
        return FixedKLController(kl_coef)
    if kind == "adaptive":
        if target_kl is None or horizon is None:
            raise AlgorithmError("the adaptive KL controller needs target_kl and horizon (algorithm.kl_target, "
                                 "algorithm.kl_horizon)")
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise AlgorithmError(f"unknown KL controller {kind!r}: use 'fixed' or 'adaptive'")
