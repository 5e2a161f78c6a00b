"""PRIME (Cui et al. 2025, arXiv 2502.01456): process rewards from an implicit PRM, its pure parts.

The implicit PRM is a copy of the policy's starting model trained online on outcome labels; a
frozen copy is its reference. Its token reward is q_t = beta (log pi_rm(y_t) - log pi_ref(y_t)),
and it learns with the cross-entropy of sigmoid(beta sum_t (log pi_rm - log pi_ref)) against the
label (0/1 correctness): the sequence's summed process reward is the PRM's logit of being right.
The estimator `prime` sums two leave-one-out (RLOO) terms: the outcome reward's (x reward_gt_coef)
on the last token and the process rewards' (x reward_dpo_coef) on every token; returns are their
reverse cumulative sums, advantages the returns whitened over the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .functional import (_valid, group_index, group_size, group_sum, masked_mean, masked_sum, masked_whiten,
                         sequence_scores)
from .registry import AlgorithmError, register_estimator

PRM_UPDATES = ("before", "after", "none")   # train the PRM, then score / score, then train / never train
PRM_LABELS = ("acc", "score")               # the BCE's target: the reward's accuracy, or its score in [0, 1]


@dataclass(frozen=True)
class PrimeParams:
    beta_train: float = 0.05       # beta: process reward = beta x log-ratio; the BCE's logit scale
    reward_gt_coef: float = 5.0    # weight of the outcome reward's RLOO term
    reward_dpo_coef: float = 5.0   # weight of the process rewards' RLOO term
    prm_lr: float = 1e-6           # the implicit PRM's AdamW learning rate
    prm_grad_clip: float = 10.0    # the PRM's gradient-norm clip
    prm_update: str = "before"     # "before": train then score; "after": score then train; "none": frozen
    prm_label: str = "acc"         # the PRM's target: "acc" (verl) or "score" (a reward in [0, 1])

    def __post_init__(self):
        if not self.beta_train > 0:
            raise ValueError(f"beta_train must be > 0, got {self.beta_train}")
        if self.reward_gt_coef < 0 or self.reward_dpo_coef < 0:
            raise ValueError("reward_gt_coef and reward_dpo_coef must be >= 0")
        if not self.prm_lr > 0 or not self.prm_grad_clip > 0:
            raise ValueError("prm_lr and prm_grad_clip must be > 0")
        if self.prm_update not in PRM_UPDATES:
            raise ValueError(f"prm_update must be one of {', '.join(PRM_UPDATES)}, got {self.prm_update!r}")
        if self.prm_label not in PRM_LABELS:
            raise ValueError(f"prm_label must be one of {', '.join(PRM_LABELS)}, got {self.prm_label!r}")


def prime_process_rewards(rm_log_prob: torch.Tensor, ref_log_prob: torch.Tensor, response_mask: torch.Tensor,
                          beta: float) -> torch.Tensor:
    """q [B, T] = beta (log pi_rm - log pi_ref) on valid tokens, 0 on padding."""
    diff = (rm_log_prob - ref_log_prob) * beta
    return torch.where(_valid(response_mask), diff, torch.zeros((), dtype=diff.dtype, device=diff.device))


def prime_prm_loss(rm_log_prob: torch.Tensor, ref_log_prob: torch.Tensor, response_mask: torch.Tensor,
                   labels: torch.Tensor, beta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-sequence BCE [B] of sigmoid(beta sum_t (log pi_rm - log pi_ref)) against labels [B] in [0, 1],
    and the logits [B]. At pi_rm = pi_ref every logit is 0 and every loss ln 2."""
    logits = masked_sum(rm_log_prob - ref_log_prob, response_mask, dim=-1) * beta
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels.to(logits.dtype), reduction="none")
    return loss, logits


def masked_rloo(rewards: torch.Tensor, mask: torch.Tensor, group_ids) -> torch.Tensor:
    """verl's PRIME leave-one-out over each group of n samples: with m_j the mean of sample j's
    rewards over its valid tokens, every valid token becomes r_t n / (n - 1) - sum_j m_j / (n - 1);
    for one reward per sample that is r_i - mean of the others. Groups of one are an error."""
    valid = _valid(mask)
    index, n_groups = group_index(group_ids, rewards.device)
    n = group_size(index, n_groups).to(rewards.dtype)
    if bool((n < 2).any()):
        raise AlgorithmError("prime's leave-one-out baseline needs at least 2 samples per group: set rollout.n >= 2")
    means = masked_mean(rewards, valid, dim=-1)                                 # [B]
    baseline = group_sum(means, index, n_groups)[index] / (n - 1)              # [B]
    out = rewards * (n / (n - 1)).unsqueeze(-1) - baseline.unsqueeze(-1)
    return torch.where(valid, out, torch.zeros((), dtype=out.dtype, device=out.device))


def last_token_mask(response_mask: torch.Tensor) -> torch.Tensor:
    """bool [B, T]: each row's last valid token (none for an empty row)."""
    valid = _valid(response_mask)
    positions = torch.arange(valid.shape[1], device=valid.device).expand_as(valid)
    last = torch.where(valid, positions, torch.full_like(positions, -1)).max(-1, keepdim=True).values
    return valid & (positions == last)


def reverse_cumsum(rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """returns_t = sum_{s >= t} r_s over valid tokens (gamma = 1), 0 on padding."""
    kept = torch.where(_valid(response_mask), rewards, torch.zeros((), dtype=rewards.dtype, device=rewards.device))
    out = kept.flip(-1).cumsum(-1).flip(-1)
    return torch.where(_valid(response_mask), out, torch.zeros_like(out))


def prime_terms(*, token_level_rewards, response_mask, group_ids, rm_scores, reward_gt_coef, reward_dpo_coef):
    """(outcome term, process term), [B, T] each, before the reverse cumsum: the outcome reward R_i
    (the row's summed token-level reward) RLOO'd on its last token x reward_gt_coef, and the PRM's
    process rewards RLOO'd on every token x reward_dpo_coef."""
    outcome = sequence_scores(token_level_rewards, response_mask).unsqueeze(-1)   # [B, 1]
    loo = masked_rloo(outcome, torch.ones_like(outcome, dtype=torch.bool), group_ids)   # every sample, tokens or not
    last = last_token_mask(response_mask)
    gt = torch.where(last, loo, torch.zeros_like(token_level_rewards)) * reward_gt_coef
    dpo = masked_rloo(rm_scores.to(token_level_rewards.dtype), response_mask, group_ids) * reward_dpo_coef
    return gt, dpo


@register_estimator("prime", needs_group=True, params=PrimeParams, reads=("rm_scores",))
def prime_advantages(*, token_level_rewards, response_mask, group_ids, rm_scores, reward_gt_coef, reward_dpo_coef,
                     **_):
    """returns = reverse cumsum of (outcome RLOO x reward_gt_coef + process RLOO x reward_dpo_coef);
    advantages = returns whitened over the batch's valid tokens. rm_scores [B, T]: the PRM's q_t."""
    gt, dpo = prime_terms(token_level_rewards=token_level_rewards, response_mask=response_mask, group_ids=group_ids,
                          rm_scores=rm_scores, reward_gt_coef=reward_gt_coef, reward_dpo_coef=reward_dpo_coef)
    returns = reverse_cumsum(gt + dpo, response_mask)
    return masked_whiten(returns, response_mask), returns
