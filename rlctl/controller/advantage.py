"""From scored rollouts to advantages, on the controller (cheap [B, T] tensor math).

scores [B] (reward + overlong shaping) -> token_level_scores [B, T] on the last response token
-> minus kl_coef x KL(old || ref) per token when KL is in the reward -> token_level_rewards
-> the configured estimator -> advantages, returns [B, T]. The columns the estimator reads (critic
values, greedy baselines, ...) are already in the batch: their passes ran because it declared them
(rlctl.algorithms.COLUMNS); nothing here branches on the algorithm's name or lists its columns.
"""

from __future__ import annotations

import numpy as np
import torch

from rlctl import algorithms
from rlctl.config.schema import Config, rollout_is_level
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


def apply_rollout_correction(batch: Batch, config: Config) -> dict:
    """verl's rollout correction: `rollout_is_weights` [B, T] into the batch (TIS) and the rejection
    mask `rollout_rs_mask` (MIS), from old_log_prob vs the engine's rollout_log_prob. Rejected
    tokens leave `response_mask` only after the advantages (compute_advantages): a rejected row's
    reward still counts in its group's baseline, and no reward moves to an earlier token.
    The hf engine samples with the trainer's own weights and kernels and reports no log-probs:
    its rollout log-probs are old_log_prob, so the weights are 1 and nothing is rejected.
    A loss that declares corrects_rollout (decoupled_ppo) weights its tokens itself: no IS weights."""
    rc, level = config.algorithm.rollout_correction, rollout_is_level(config)
    if algorithms.get_policy_loss(config.actor.policy_loss).corrects_rollout and not rc.bypass_mode:
        level = ""
    if not (level or rc.rollout_rs):
        return {}
    old = torch.from_numpy(batch["old_log_prob"].astype(np.float32))
    rollout = torch.from_numpy(batch["rollout_log_prob"].astype(np.float32)) if "rollout_log_prob" in batch else old
    weights, mask, metrics = algorithms.rollout_correction(
        old, rollout, torch.from_numpy(batch["response_mask"].astype(np.float32)), rollout_is=level,
        rollout_is_threshold=rc.rollout_is_threshold, rollout_is_batch_normalize=rc.rollout_is_batch_normalize,
        rollout_rs=rc.rollout_rs, rollout_rs_threshold=rc.rollout_rs_threshold)
    if weights is not None:
        batch["rollout_is_weights"] = weights.numpy().astype(np.float32)
    if rc.rollout_rs:
        batch["rollout_rs_mask"] = mask.numpy().astype(batch["response_mask"].dtype)
    return metrics


def compute_advantages(batch: Batch, config: Config, kl_ctrl) -> dict:
    """Add token_level_rewards, advantages and returns to `batch`; return metrics."""
    mask = torch.from_numpy(batch["response_mask"].astype(np.float32))
    scores, metrics = shaped_scores(batch, config)
    episodes = batch["agent_episode"] if "agent_episode" in batch else None   # agent rollouts: groups of episodes
    if episodes is not None:
        scores = on_last_rows(scores, episodes)
    rewards = algorithms.scores_to_token_rewards(torch.from_numpy(scores), mask).float()
    algo = config.algorithm
    if algo.kl_in_reward:
        rewards, current_kl = algorithms.apply_kl_in_reward(
            rewards, old_log_prob=torch.from_numpy(batch["old_log_prob"]),
            ref_log_prob=torch.from_numpy(batch["ref_log_prob"]), response_mask=mask,
            kl_coef=kl_ctrl.value, kind=algo.kl_type)
        metrics.update({"actor/reward_kl": current_kl, "actor/kl_coef": kl_ctrl.value})
        kl_ctrl.update(current_kl, n_steps=len(batch))
    advantages, returns = algorithms.compute_advantages(
        algo.name, token_level_rewards=rewards, response_mask=mask, group_ids=batch["uid"].tolist(),
        gamma=algo.gamma, lam=algo.lam, norm_adv_by_std=algo.norm_adv_by_std, params=algo.params,
        episode_ids=episodes, **read_columns(batch, algorithms.get_estimator(algo.name).reads))
    batch["token_level_rewards"] = rewards.numpy().astype(np.float32)
    batch["advantages"] = advantages.float().numpy()
    batch["returns"] = returns.float().numpy()
    if "teacher_log_prob" in batch:   # on-policy distillation: the teacher's per-token advantages
        from rlctl.controller.distill import distill_advantages

        metrics.update(distill_advantages(batch, config))
        advantages = torch.from_numpy(batch["advantages"])
    if "rollout_rs_mask" in batch:   # MIS: rejected tokens get no loss (rewards and baselines saw them all)
        batch["response_mask"] = batch["rollout_rs_mask"]
    valid = mask > 0
    metrics.update({"critic/advantages/mean": float(advantages[valid].mean()) if valid.any() else 0.0,
                    "critic/advantages/max": float(advantages[valid].max()) if valid.any() else 0.0,
                    "critic/advantages/min": float(advantages[valid].min()) if valid.any() else 0.0,
                    "critic/returns/mean": float(returns[valid].mean()) if valid.any() else 0.0})
    return metrics


def on_last_rows(scores: np.ndarray, episodes: np.ndarray) -> np.ndarray:
    """Each agent episode's score on its last row only, 0 on its others: compute_advantages folds an
    episode's rows into one (rlctl.algorithms.episodes), where the outcome must count once, at the end."""
    last = {int(e): row for row, e in enumerate(episodes.tolist())}
    keep = np.zeros(len(scores), dtype=bool)
    keep[list(last.values())] = True
    return np.where(keep, scores, 0.0)


def read_columns(batch: Batch, reads) -> dict:
    """The batch columns an estimator `reads`, as the batch holds them (compute_advantages checks and
    shapes each by its form in rlctl.algorithms.COLUMNS); reward_components: the reward's named
    components {name: [B]}, which rollout.score stores as reward_component/<name> columns."""
    out = {c: batch[c] for c in reads if c in batch}
    if "reward_components" in reads:
        prefix = "reward_component/"
        out["reward_components"] = {k[len(prefix):]: batch[k].astype(np.float32) for k in batch.keys()
                                    if k.startswith(prefix)}
    return out


def policy_filtration(batch: Batch, config: Config, seed: int) -> tuple[Batch, dict]:
    """PF-PPO: each prompt's rows resampled (with replacement, to their number) by weights from their
    raw scores (reward + overlong shaping, before any KL), every column indexed alike, so the critic
    and the actor train on the filtered batch. `seed` makes a step's draw reproducible on resume."""
    pf = config.algorithm.pf_ppo
    scores, _ = shaped_scores(batch, config)
    index = algorithms.pf_ppo_resample(scores, batch["uid"].tolist(), pf.reweight_method, pf.weight_pow,
                                       np.random.default_rng(seed))
    return batch.select(index), {"pf_ppo/unique_frac": len(set(index.tolist())) / max(len(index), 1),
                                 "pf_ppo/score_mean": float(scores[index].mean()) if len(index) else 0.0}
