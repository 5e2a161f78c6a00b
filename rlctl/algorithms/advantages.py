"""Advantage estimators, registered by name, and `compute_advantages`, the one entry point.

Shapes: token_level_rewards, response_mask, values, advantages, returns are [B, T] over response
tokens only; group_ids and reward_baselines are per sequence [B]. Each estimator matches verl's
(`verl/trainer/ppo/core_algos.py`) on valid positions for the same inputs; rlctl additionally puts
0 at every padding position of both outputs, and ignores whatever the inputs hold there.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import torch

from .columns import COLUMNS, COMPONENTS, FLAG, RAW, SEQUENCE, TOKEN
from .columns import column as column_of
from .episodes import EpisodeFold
from .functional import group_index, group_sum, masked_whiten, sequence_scores
from .params import make_params, params_kwargs
from .registry import AlgorithmError, get_estimator, register_estimator


def compute_advantages(name: str, *, token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                       group_ids=None, values: torch.Tensor | None = None,
                       reward_baselines: torch.Tensor | None = None, gamma: float = 1.0, lam: float = 1.0,
                       norm_adv_by_std: bool = True, epsilon: float = 1e-6, params: Mapping | None = None,
                       episode_ids=None, **columns) -> tuple[torch.Tensor, torch.Tensor]:
    """Run the estimator registered as `name`; returns (advantages, returns), [B, T] each, no grad.

    columns: batch columns by name (old_log_prob=..., reward_components={name: [B]}, ...); the
    estimator receives those it `reads`, each checked and shaped by its form in
    rlctl.algorithms.columns (a [B, T] one zeroed on padding), and the others are ignored. values
    and reward_baselines are two such columns, named here for callers. params: its own parameters
    ([algorithm.params], checked against its dataclass). Computes in at least float32.

    episode_ids [B]: rows with one id are one sample (an agent episode that became several rows): the
    estimator sees each episode as one row, its rows one after another (rlctl.algorithms.episodes), so
    it counts once in its group; a negative id marks a padding row (zeros). An episode with no valid
    token (it made no model call) is a sample with nothing to train: its score sits on its first row's
    first position (as scores_to_token_rewards puts it) and still counts in its group (sequence_scores).
    """
    spec = get_estimator(name)
    own = params_kwargs(make_params(f"advantage estimator {name!r}", spec.params, params))
    rewards = _as_matrix("token_level_rewards", token_level_rewards)
    dtype = torch.promote_types(rewards.dtype, torch.float32)
    valid = _mask_of(response_mask, rewards.shape)
    if unknown := [c for c in columns if c not in COLUMNS and c not in spec.reads]:
        raise AlgorithmError(f"estimator {name!r} was given {unknown}, which it does not read and which are not batch "
                             f"columns rlctl knows (rlctl.algorithms.COLUMNS)")
    given = {**columns, **{k: x for k, x in (("values", values), ("reward_baselines", reward_baselines))
                           if x is not None}}
    shown = (*spec.reads, *(c for c in ("values", "reward_baselines") if c in given and c not in spec.reads))
    inputs = {"values": None, "reward_baselines": None}
    for column in shown:
        inputs.update(_column_input(spec, column, given.get(column), valid, dtype, own))
    if spec.needs_group or group_ids is not None:
        group_ids = _group_ids(name, group_ids, rewards.shape[0])
    fold = EpisodeFold.of(episode_ids, rewards.shape[0]) if episode_ids is not None else None
    if fold is not None and fold.identity:
        fold = None
    if fold is not None:
        if group_ids is not None:
            fold.check_groups(group_ids)
            group_ids = fold.rows(group_ids)
        inputs = {k: _fold_input(fold, k, x, rewards.shape) for k, x in inputs.items()}
        rewards, valid_in = fold.tokens(rewards), fold.tokens(valid)
    else:
        valid_in = valid
    with torch.no_grad():
        advantages, returns = spec.fn(token_level_rewards=_scored(rewards, valid_in, dtype, episode_ids is not None),
                                      response_mask=valid_in.to(dtype), group_ids=group_ids, gamma=gamma, lam=lam,
                                      norm_adv_by_std=norm_adv_by_std, epsilon=epsilon, **{**own, **inputs})
    for what, out in (("advantages", advantages), ("returns", returns)):
        if not isinstance(out, torch.Tensor) or out.shape != rewards.shape:
            raise AlgorithmError(f"estimator {name!r} returned {what} that is not a [B, T] tensor of shape "
                                 f"{tuple(rewards.shape)}; fix the estimator")
    if fold is not None:
        advantages, returns = fold.unfold(advantages, valid.shape[1]), fold.unfold(returns, valid.shape[1])
    zero = torch.zeros((), dtype=dtype, device=valid.device)
    return torch.where(valid, advantages, zero), torch.where(valid, returns, zero)


def _scored(rewards: torch.Tensor, valid: torch.Tensor, dtype, episodes: bool) -> torch.Tensor:
    """The rewards an estimator sees: those on valid tokens, zeros elsewhere; with episodes, an episode
    without any valid token keeps the score on its first position (it counts in its group: sequence_scores)."""
    kept = valid.clone()
    if episodes:
        kept[:, 0] |= ~valid.any(-1)
    return torch.where(kept, rewards.to(dtype), torch.zeros((), dtype=dtype, device=rewards.device))


def _fold_input(fold: EpisodeFold, column: str, x, shape):
    """A column as the folded estimator receives it: a [B, T] one folded like the rewards, a per-row one
    the episode's first row's (reward_components [K, B] along B)."""
    if x is None:
        return None
    if column == "reward_components":
        return fold.rows(x, dim=1)
    if column_of(column).form == TOKEN:
        return fold.tokens(x)
    if column == "reward_weights":
        return x
    return fold.rows(x)


def _column_input(spec, column: str, x, valid: torch.Tensor, dtype, own: dict) -> dict:
    """{column: tensor} as the estimator receives a column it reads, by the column's form (see
    rlctl.algorithms.columns); an optional column that is absent arrives as None."""
    name, form, batch = spec.name, column_of(column).form, valid.shape[0]
    if x is None and column_of(column).optional:
        return {column: None}
    if form == COMPONENTS:
        return _components_input(name, x, batch, dtype, own)
    if x is None and form == RAW:
        raise AlgorithmError(f"estimator {name!r} reads the batch column {column!r}, which was not given")
    x = torch.from_numpy(x) if isinstance(x, np.ndarray) else x   # the controller's batch holds numpy
    if form == TOKEN:
        zero = torch.zeros((), dtype=dtype, device=valid.device)
        return {column: torch.where(valid, _required(name, column, x, valid.shape).to(dtype), zero)}
    if form == SEQUENCE:
        return {column: _required(name, column, x, (batch,)).to(dtype)}
    if form == FLAG:
        return {column: _required(name, column, x, (batch,)).bool()}
    x = torch.as_tensor(x)
    if x.dim() == 0 or x.shape[0] != batch:
        raise AlgorithmError(f"column {column!r} for estimator {name!r} must have first dimension "
                             f"{batch}, got shape {tuple(x.shape)}")
    return {column: x}


def _components_input(name: str, given, batch: int, dtype, own: dict) -> dict:
    """reward_components [K, B] of the params' reward_keys (and reward_weights [K] when given) from
    the reward's components {name: [B]}; nothing when its reward_keys are empty."""
    keys, extra = own["reward_keys"], {}
    if keys:
        missing = [k for k in keys if k not in (given or {})]
        if missing:
            raise AlgorithmError(f"estimator {name!r} needs the reward components {missing} (its reward_keys); "
                                 "the reward function must return them in its dict")
        stacked = torch.stack([torch.as_tensor(given[k]) for k in keys])
        extra["reward_components"] = _components(name, stacked, batch).to(dtype)
        if own["reward_weights"]:
            extra["reward_weights"] = _required(name, "reward_weights", torch.as_tensor(own["reward_weights"]),
                                                stacked.shape[:1]).to(dtype)
    return extra


def _components(name: str, x, batch: int) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or x.shape[1] != batch:
        raise AlgorithmError(f"reward_components must be a [K, B] tensor with B = {batch} for estimator {name!r}, "
                             f"got {getattr(x, 'shape', type(x).__name__)}")
    if not torch.isfinite(x).all():
        raise AlgorithmError(f"reward_components for estimator {name!r} hold NaN or inf: every sample's reward "
                             "must return every component")
    return x


def _as_matrix(what: str, x) -> torch.Tensor:
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise AlgorithmError(f"{what} must be a [B, T] torch tensor, got {getattr(x, 'shape', type(x).__name__)}")
    return x


def _mask_of(response_mask, shape) -> torch.Tensor:
    mask = _as_matrix("response_mask", response_mask)
    if mask.shape != shape:
        raise AlgorithmError(f"response_mask {tuple(mask.shape)} must match token_level_rewards {tuple(shape)}")
    return mask if mask.dtype == torch.bool else mask != 0


def _required(name: str, what: str, x, shape) -> torch.Tensor:
    if x is None:
        raise AlgorithmError(f"estimator {name!r} needs {what} (shape {tuple(shape)}) but none was given")
    if not isinstance(x, torch.Tensor) or x.shape != shape:
        raise AlgorithmError(f"{what} must be a tensor of shape {tuple(shape)} for estimator {name!r}, "
                             f"got {getattr(x, 'shape', type(x).__name__)}")
    return x


def _group_ids(name: str, group_ids, batch: int):
    if group_ids is None:
        raise AlgorithmError(f"estimator {name!r} needs group_ids (one id per sequence, e.g. the prompt uid)")
    if len(group_ids) != batch:
        raise AlgorithmError(f"group_ids has {len(group_ids)} entries but the batch has {batch} sequences")
    return group_ids


def _group_stats(scores: torch.Tensor, group_ids):
    """Per-sequence (group mean, group unbiased std, group size) of scores [B], each [B]."""
    index, n_groups = group_index(group_ids, scores.device)
    count = torch.bincount(index, minlength=n_groups).to(scores.dtype)
    mean = group_sum(scores, index, n_groups) / count
    sq_dev = group_sum((scores - mean[index]) ** 2, index, n_groups)
    std = (sq_dev / (count - 1).clamp(min=1)).sqrt()
    return mean[index], std[index], count[index]


@register_estimator("gae", reads=("values",))
def gae(*, token_level_rewards, values, response_mask, gamma, lam, **_):
    """PPO's GAE: delta_t = r_t + gamma V_{t+1} - V_t, A_t = delta_t + gamma lam A_{t+1}.

    The recursion runs over valid tokens only: at a padding (or masked observation) position
    the next value and running advantage pass through unchanged. returns = A + V (the critic's
    target, before whitening); advantages are whitened over all valid tokens of the batch.
    """
    advantages = gae_advantages(token_level_rewards, values, response_mask, gamma, lam)
    return masked_whiten(advantages, response_mask), advantages + values


def gae_advantages(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float,
                   lam) -> torch.Tensor:
    """GAE's A [B, T] before whitening (see gae); `lam` a float or one per row [B] (VAPO's
    length-adaptive lambda)."""
    batch, horizon = rewards.shape
    lam = torch.as_tensor(lam, dtype=rewards.dtype, device=rewards.device).expand(batch)
    next_value, running = rewards.new_zeros(batch), rewards.new_zeros(batch)
    advantages = torch.zeros_like(rewards)
    for t in reversed(range(horizon)):
        valid = mask[:, t] > 0
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        running = torch.where(valid, delta + gamma * lam * running, running)
        next_value = torch.where(valid, values[:, t], next_value)
        advantages[:, t] = running
    return advantages


@register_estimator("grpo", needs_group=True)
def grpo(*, token_level_rewards, response_mask, group_ids, norm_adv_by_std, epsilon, **_):
    """GRPO: A_i = (R_i - mean_g R) / (std_g R + epsilon), R_i = sum of the row's rewards,
    broadcast over the row's tokens; std is unbiased. norm_adv_by_std=False gives Dr. GRPO
    (A_i = R_i - mean_g R). A group of one uses verl's convention mean 0, std 1: A_i = R_i / (1 + eps)
    (R_i with Dr. GRPO) -- the raw score, not 0.
    """
    scores = sequence_scores(token_level_rewards, response_mask)               # [B]
    adv = grpo_scores(scores, group_ids, norm_adv_by_std, epsilon).unsqueeze(-1) * response_mask
    return adv, adv


def grpo_scores(scores: torch.Tensor, group_ids, norm_adv_by_std: bool, epsilon: float) -> torch.Tensor:
    """GRPO's per-sequence advantage [B] of scores [B] (see grpo), before broadcasting over tokens."""
    mean, std, count = _group_stats(scores, group_ids)
    single = count == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    adv = scores - mean
    if norm_adv_by_std:
        adv = adv / (torch.where(single, torch.ones_like(std), std) + epsilon)
    return adv


@register_estimator("rloo", needs_group=True)
def rloo(*, token_level_rewards, response_mask, group_ids, **_):
    """RLOO: A_i = R_i - mean_{j != i} R_j = n/(n-1) (R_i - mean_g R), broadcast over tokens.
    A group of one has no other sample: A_i = R_i (verl's `rloo` convention)."""
    scores = sequence_scores(token_level_rewards, response_mask)
    mean, _, count = _group_stats(scores, group_ids)
    loo = (scores - mean) * count / (count - 1).clamp(min=1)
    adv = torch.where(count > 1, loo, scores).unsqueeze(-1) * response_mask
    return adv, adv


@register_estimator("remax", reads=("reward_baselines",))
def remax(*, token_level_rewards, response_mask, reward_baselines, **_):
    """ReMax: returns_t = sum_{s >= t} r_s (undiscounted), A_t = returns_t - b, where b [B] is the
    score of the greedy rollout of the same prompt. With one outcome reward A_t = R - b on every token."""
    returns = (token_level_rewards * response_mask).flip(-1).cumsum(-1).flip(-1)
    advantages = returns - reward_baselines.unsqueeze(-1) * response_mask
    return advantages, returns


@register_estimator("reinforce_plus_plus")
def reinforce_plus_plus(*, token_level_rewards, response_mask, gamma, **_):
    """REINFORCE++: G_t = r_t + gamma G_{t+1} over the row's valid tokens, then whitened over all
    valid tokens of the batch. A masked position (a multi-turn sample's tool or user tokens) is
    not a time step: the return passes it unchanged, so the outcome reward at the last model
    token reaches every earlier turn. (verl resets the return there instead, which gives earlier
    turns a return of 0; on single-turn rows, where masked positions only trail, both agree.)"""
    returns = torch.zeros_like(token_level_rewards)
    running = token_level_rewards.new_zeros(token_level_rewards.shape[0])
    for t in reversed(range(token_level_rewards.shape[1])):
        valid = response_mask[:, t] > 0
        running = torch.where(valid, token_level_rewards[:, t] + gamma * running, running)
        returns[:, t] = running * response_mask[:, t]
    return masked_whiten(returns, response_mask), returns


@register_estimator("reinforce_plus_plus_baseline", needs_group=True)
def reinforce_plus_plus_baseline(*, token_level_rewards, response_mask, group_ids, **_):
    """REINFORCE++-baseline: A_i = R_i - mean_g R broadcast over tokens, then whitened over all valid
    tokens of the batch. A group of one has baseline 0 (verl's convention); returns = advantages."""
    scores = sequence_scores(token_level_rewards, response_mask)
    mean, _, count = _group_stats(scores, group_ids)
    centred = scores - torch.where(count > 1, mean, torch.zeros_like(mean))
    adv = masked_whiten(centred.unsqueeze(-1) * response_mask, response_mask)
    return adv, adv
