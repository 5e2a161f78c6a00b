"""From scored rollouts to advantages, on the controller (cheap [B, T] tensor math).

scores [B] (reward + overlong shaping) -> token_level_scores [B, T] on the last response token
-> minus kl_coef x KL(old || ref) per token when KL is in the reward -> token_level_rewards
-> the configured estimator -> advantages, returns [B, T]. Everything the estimator needs
(group ids, critic values, greedy baselines) is already in the batch; nothing here branches on
the algorithm's name.
"""

from __future__ import annotations

import numpy as np
import torch

from rlctl import algorithms
from rlctl.config.schema import Config
from rlctl.runtime.batch import Batch


def shaped_scores(batch: Batch, config: Config) -> tuple[np.ndarray, dict]:
    """Per-sequence score: the reward plus DAPO's overlong penalty when enabled."""
    scores = batch["scores"].astype(np.float64)
    overlong = config.reward.overlong
    if not overlong.enable:
        return scores, {}
    penalty = algorithms.overlong_penalty(batch["response_length"], max_response_length=config.data.max_response_length,
                                          buffer_len=overlong.buffer_len,
                                          penalty_factor=overlong.penalty_factor).numpy()
    return scores + penalty, {"reward/overlong_penalty": float(penalty.mean()),
                              "reward/overlong_frac": float((penalty < 0).mean())}


def compute_advantages(batch: Batch, config: Config, kl_ctrl) -> dict:
    """Add token_level_rewards, advantages and returns to `batch`; return metrics."""
    mask = torch.from_numpy(batch["response_mask"].astype(np.float32))
    scores, metrics = shaped_scores(batch, config)
    rewards = algorithms.scores_to_token_rewards(torch.from_numpy(scores), mask).float()
    algo = config.algorithm
    if algo.kl_in_reward:
        rewards, current_kl = algorithms.apply_kl_in_reward(
            rewards, old_log_prob=torch.from_numpy(batch["old_log_prob"]),
            ref_log_prob=torch.from_numpy(batch["ref_log_prob"]), response_mask=mask,
            kl_coef=kl_ctrl.value, kind=algo.kl_type)
        metrics.update({"actor/reward_kl": current_kl, "actor/kl_coef": kl_ctrl.value})
        kl_ctrl.update(current_kl, n_steps=len(batch))
    optional = {}
    if "values" in batch:
        optional["values"] = torch.from_numpy(batch["values"])
    if "reward_baselines" in batch:
        optional["reward_baselines"] = torch.from_numpy(batch["reward_baselines"].astype(np.float32))
    for key in ("ref_log_prob", "old_log_prob"):   # read by estimators that declare needs_reference
        if key in batch:
            optional[key] = torch.from_numpy(batch[key])
    advantages, returns = algorithms.compute_advantages(
        algo.name, token_level_rewards=rewards, response_mask=mask, group_ids=batch["uid"].tolist(),
        gamma=algo.gamma, lam=algo.lam, norm_adv_by_std=algo.norm_adv_by_std, **optional)
    batch["token_level_rewards"] = rewards.numpy().astype(np.float32)
    batch["advantages"] = advantages.float().numpy()
    batch["returns"] = returns.float().numpy()
    valid = mask > 0
    metrics.update({"critic/advantages/mean": float(advantages[valid].mean()) if valid.any() else 0.0,
                    "critic/advantages/max": float(advantages[valid].max()) if valid.any() else 0.0,
                    "critic/advantages/min": float(advantages[valid].min()) if valid.any() else 0.0,
                    "critic/returns/mean": float(returns[valid].mean()) if valid.any() else 0.0})
    return metrics
