"""Self-play fine-tuning: SPIN (Chen et al. 2024, arXiv 2401.01335) and SPPO (Wu et al. 2024,
arXiv 2405.00675), the two self-play algorithms of verl's recipes.

SPIN plays the policy against its previous iterate (the opponent, pi_t): the main player learns to
tell the dataset's reference answer y (the SFT data) from the opponent's own generation y'. With
the logistic loss its objective is DPO's with y as "chosen", y' as "rejected" and pi_t as the
reference (verl's recipe/spin: `compute_online_dpo_loss`):

    loss = -log sigmoid(beta * [(log pi(y) - log pi_t(y)) - (log pi(y') - log pi_t(y'))])

SPPO plays for the Nash equilibrium of a preference game. For each prompt it samples K responses
from pi_t, estimates each one's win rate against pi_t under a preference model,
P_hat(y > pi_t) = 1/K sum_k P(y > y_k), and regresses the log-ratio onto it (the paper's eq. 4.4;
verl's recipe/sppo `compute_sppo_loss`):

    loss = (log pi(y) - log pi_t(y) - eta * (P_hat(y > pi_t) - 1/2))^2

Log-probs of a sequence are sums over its response tokens. Shapes: [B, T] per token, [B] per
sequence; a SPIN batch holds pairs (one reference row and one generated row per pair id).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .aggregation import aggregate_loss
from .functional import group_index, group_size, masked_sum, sequence_scores
from .registry import AlgorithmError, register_estimator, register_policy_loss


def spin_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor, opponent_chosen: torch.Tensor,
              opponent_rejected: torch.Tensor, beta: float) -> torch.Tensor:
    """SPIN's logistic loss per pair [P] from sequence log-probs [P]: chosen = the reference answer,
    rejected = the generation; the opponent is the frozen previous iterate."""
    margin = (policy_chosen - opponent_chosen) - (policy_rejected - opponent_rejected)
    return -F.logsigmoid(beta * margin)


def sppo_loss(log_ratio: torch.Tensor, win_rate: torch.Tensor, eta: float) -> torch.Tensor:
    """SPPO's squared loss per sequence [B]: log_ratio = log pi(y) - log pi_t(y) [B] (sequence sums),
    win_rate = P_hat(y > pi_t) [B] in [0, 1]."""
    return (log_ratio - eta * (win_rate - 0.5)) ** 2


def _pairs(group_ids, real_response: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen row [P], rejected row [P]) from pair ids and the reference-answer flag [B]."""
    if group_ids is None:
        raise AlgorithmError("spin needs group_ids: one id per pair of reference answer and generation")
    index, n_groups = group_index(group_ids, real_response.device)
    real = real_response.bool()
    chosen = torch.full((n_groups,), -1, dtype=torch.long)
    rejected = torch.full((n_groups,), -1, dtype=torch.long)
    for row, (g, is_real) in enumerate(zip(index.tolist(), real.tolist())):
        slot = chosen if is_real else rejected
        if slot[g] >= 0:
            raise AlgorithmError(f"spin needs each pair id to hold one reference answer and one generation; pair {g} "
                                 f"has two {'reference answers' if is_real else 'generations'}")
        slot[g] = row
    if bool((chosen < 0).any() or (rejected < 0).any()):
        raise AlgorithmError("spin needs each pair id to hold one reference answer and one generation; "
                             f"{int((chosen < 0).sum() + (rejected < 0).sum())} pair(s) miss one")
    return chosen, rejected


@dataclass(frozen=True)
class SpinParams:
    dpo_beta: float = 0.1   # beta of SPIN's logistic (DPO) loss (verl's recipe/spin default)

    def __post_init__(self):
        if not self.dpo_beta > 0:
            raise ValueError(f"dpo_beta must be > 0, got {self.dpo_beta}")


@register_estimator("spin", reads=("ref_log_prob", "old_log_prob", "real_response"), params=SpinParams)
def spin_advantages(*, response_mask, group_ids, old_log_prob, ref_log_prob, real_response, dpo_beta, **_):
    """SPIN as per-sequence advantages: A_i = -2 d loss_pair / d log pi(y_i), from the policy's log-probs
    before the update (old_log_prob) and the opponent's (ref_log_prob), on every response token.

    With the vanilla policy loss and loss_agg_mode = "seq-mean-token-sum", the gradient of the first
    optimizer step on the batch is exactly the gradient of mean_pairs spin_loss (two sequences a
    pair, hence the 2); later mini-batches or epochs keep these weights, as PPO keeps its advantages."""
    chosen, rejected = _pairs(group_ids, real_response)
    seq = masked_sum(old_log_prob, response_mask, dim=-1).detach().requires_grad_(True)
    opp = masked_sum(ref_log_prob, response_mask, dim=-1)
    with torch.enable_grad():
        loss = spin_loss(seq[chosen], seq[rejected], opp[chosen], opp[rejected], dpo_beta).sum()
        (grad,) = torch.autograd.grad(loss, seq)
    adv = (-2.0 * grad).unsqueeze(-1) * response_mask
    return adv, adv


def win_rates(scores: torch.Tensor, group_ids) -> torch.Tensor:
    """P_hat(y_i > pi_t) [B]: the mean over the K samples of y_i's group (itself included, as the paper's
    1/K sum_k) of the Bradley-Terry preference P(y_i > y_k) = sigmoid(r_i - r_k) of the reward's scores."""
    index, n_groups = group_index(group_ids, scores.device)
    same = index.unsqueeze(0) == index.unsqueeze(1)                                   # [B, B]
    prefs = torch.sigmoid(scores.unsqueeze(1) - scores.unsqueeze(0)) * same            # P(y_i > y_k) in group
    return prefs.sum(1) / group_size(index, n_groups).to(scores.dtype)


@register_estimator("sppo", needs_group=True)
def sppo_advantages(*, token_level_rewards, response_mask, group_ids, **_):
    """SPPO's target without eta: P_hat(y > pi_t) - 1/2 on every response token (the sppo policy loss
    multiplies by its sppo_eta). Groups of one have win rate 1/2 against themselves: target 0."""
    scores = sequence_scores(token_level_rewards, response_mask)
    index, n_groups = group_index(group_ids, scores.device)
    if bool((group_size(index, n_groups) < 2).any()):
        raise AlgorithmError("sppo estimates win rates within a prompt's samples: set rollout.n >= 2")
    adv = (win_rates(scores, group_ids) - 0.5).unsqueeze(-1) * response_mask
    return adv, adv


@dataclass(frozen=True)
class SppoParams:
    sppo_eta: float = 1.0   # eta, the scale of the win-rate target (verl's recipe/sppo default)

    def __post_init__(self):
        if not self.sppo_eta > 0:
            raise ValueError(f"sppo_eta must be > 0, got {self.sppo_eta}")


@register_policy_loss("sppo", loss_agg_mode="seq-mean-token-sum", trust_region=True, params=SppoParams)
def sppo_policy_loss(*, old_log_prob, log_prob, advantages, response_mask, sppo_eta, norm=None,
                     rollout_is_weights=None, **_):
    """SPPO's squared loss with pi_t = the policy that generated the batch (old_log_prob, as verl's
    recipe): log_ratio is the sequence sum of log_prob - old_log_prob, the win rate is read from the
    sppo estimator's advantages (P_hat - 1/2, the same on every token). The square keeps the update
    near pi_t (its minimum sits at log_ratio = eta (P_hat - 1/2)): the trust region."""
    mask = response_mask.to(log_prob.dtype)
    lengths = mask.sum(-1)
    log_ratio = ((log_prob - old_log_prob.detach()) * mask).sum(-1)
    target = (advantages * mask).sum(-1) / lengths.clamp(min=1)
    per_seq = sppo_loss(log_ratio, target.detach() + 0.5, sppo_eta)                # [B]
    per_token = per_seq.unsqueeze(-1) * mask / lengths.clamp(min=1).unsqueeze(-1)   # token sum = per_seq
    if rollout_is_weights is not None:
        per_token = per_token * rollout_is_weights.detach().to(per_token.dtype)
    loss = aggregate_loss(per_token, mask, "seq-mean-token-sum", norm=norm)
    valid = lengths > 0
    return loss, {"sppo/log_ratio": float(log_ratio.detach()[valid].mean()) if valid.any() else 0.0,
                  "pg_clipfrac": 0.0, "pg_clipfrac_lower": 0.0,
                  "ppo_kl": float(-((log_prob.detach() - old_log_prob) * mask).sum() / mask.sum().clamp(min=1))}
