"""The names a config key may take where their owner lives in a heavier package (rlctl.algorithms
imports torch; `--help` and `config validate` must not), and other fixed texts of the schema."""

from __future__ import annotations

# Copies of rlctl.algorithms' names (it imports torch, which `--help` and `config validate` must not);
# tests/config/test_constants.py keeps them equal to the originals.
LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")
POLICY_LOSSES = ("vanilla", "gspo", "sapo", "cispo", "geo_mean", "clip_cov", "kl_cov", "gpg", "dppo_tv", "dppo_kl", "dro",
                 "decoupled_ppo", "sppo", "vapo")
KL_TYPES = ("k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl", "k1+", "kl+", "abs+", "k2+", "mse+", "k3+",
            "low_var_kl+")   # "+": that value with k2's gradient (straight-through)
ADV_ESTIMATORS = ("gae", "grpo", "rloo", "remax", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "grpo_passk",
                  "opo", "gpg", "gdpo", "optimal_token_baseline", "spin", "sppo", "vapo", "prime")
PF_PPO_REWEIGHT_METHODS = ("pow", "max_min", "max_random")   # rlctl.algorithms.pf_ppo.REWEIGHT_METHODS
LOGGERS = ("console", "jsonl", "tensorboard", "wandb")
REWARD_SOURCES = ("function", "model", "judge", "remote")   # rlctl.rewards.registry.SOURCES (a test keeps them equal)
JUDGE_PROMPT = ("Grade the response to the question. Reply with a single number from 0 to 10 on the last line.\n\n"
                "Question:\n{question}\n\nReference answer:\n{ground_truth}\n\nResponse:\n{response}")

# Keys that moved into an algorithm's own parameter table -> (new key, the algorithm that reads it). The
# loader refuses each in a user's file with its new place, and moves it in a run's config.resolved.toml
# written before the move (so older runs still resume and merge).
_LOSS_KEYS = {"tau_pos": "sapo", "tau_neg": "sapo", "clip_cov_ratio": "clip_cov", "clip_cov_lb": "clip_cov",
              "clip_cov_ub": "clip_cov", "kl_cov_ratio": "kl_cov", "ppo_kl_coef": "kl_cov", "dro_beta": "dro",
              "sppo_eta": "sppo"}
MOVED_KEYS = {**{f"actor.{k}": (f"actor.loss_params.{k}", loss) for k, loss in _LOSS_KEYS.items()},
              "algorithm.dpo_beta": ("algorithm.params.dpo_beta", "spin"),
              "algorithm.gdpo_reward_keys": ("algorithm.params.reward_keys", "gdpo"),
              "algorithm.gdpo_reward_weights": ("algorithm.params.reward_weights", "gdpo")}
