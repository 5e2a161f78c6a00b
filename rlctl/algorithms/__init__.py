"""rlctl.algorithms: the RL math as pure torch functions. Imports only torch, numpy and the stdlib.

Advantage estimators and policy losses are registered by name with the batch columns they read
(`COLUMNS`: the pass that fills each); the training loop calls `compute_advantages`, `policy_loss`,
`value_loss`, `kl_penalty`, `aggregate_loss` and reads `algorithm_needs(...)` instead of branching
on names. See docs/algorithms.md.
"""

from .columns import COLUMNS, Column, update_columns
from .aggregation import LOSS_AGG_MODES, LossNorm, aggregate_loss
from .advantages import compute_advantages
from . import group_estimators  # noqa: F401  (registers grpo_passk, opo, gpg, gdpo, optimal_token_baseline)
from .distill import (DistillLossSpec, distill_advantages, distill_loss, distill_loss_names, distill_stats,
                      get_distill_loss, register_distill_loss)
from .functional import (entropy_from_logits, group_index, log_probs_from_logits, masked_mean, masked_sum,
                         masked_var, masked_whiten, sum_pi_squared_from_logits)
from .kl import (KL_KINDS, AdaptiveKLController, FixedKLController, apply_kl_in_reward, kl_penalty,
                 make_kl_controller)
from .losses import policy_loss, value_loss
from . import policy_loss_variants  # noqa: F401  (registers sapo, cispo, geo_mean, clip_cov, kl_cov, gpg, dppo_*)
from . import decoupled  # noqa: F401  (registers decoupled_ppo)
from . import vapo  # noqa: F401  (registers the vapo estimator and loss)
from .prime import PrimeParams, masked_rloo, prime_process_rewards, prime_prm_loss  # (registers prime)
from .selfplay import sppo_loss, spin_loss, win_rates   # (registers spin, sppo)
from .registry import (AlgorithmError, EstimatorSpec, Needs, PolicyLossSpec, RequiredParam, algorithm_needs,
                       estimator_names, estimator_params, get_estimator, get_policy_loss, loss_params,
                       policy_loss_names, register_estimator, register_policy_loss, run_needs)
from .pf_ppo import REWEIGHT_METHODS, pf_ppo_resample, pf_ppo_weights
from .rollout_correction import rollout_correction
from .dynamic_sampling import GroupFilter, filter_groups
from .shaping import overlong_penalty, scores_to_token_rewards

__all__ = [
    "COLUMNS", "Column", "update_columns",
    "AdaptiveKLController", "AlgorithmError", "DistillLossSpec", "distill_advantages", "distill_loss",
    "distill_loss_names", "distill_stats", "get_distill_loss", "register_distill_loss", "EstimatorSpec", "FixedKLController", "GroupFilter", "KL_KINDS",
    "LOSS_AGG_MODES", "LossNorm", "Needs", "PolicyLossSpec", "RequiredParam", "aggregate_loss", "algorithm_needs",
    "run_needs",
    "apply_kl_in_reward", "compute_advantages", "entropy_from_logits", "estimator_names", "estimator_params",
    "filter_groups", "loss_params",
    "get_estimator", "get_policy_loss", "group_index", "kl_penalty", "log_probs_from_logits",
    "make_kl_controller", "pf_ppo_resample", "pf_ppo_weights", "REWEIGHT_METHODS", "masked_mean", "masked_sum", "masked_var", "masked_whiten", "overlong_penalty",
    "policy_loss", "policy_loss_names", "PrimeParams", "masked_rloo", "prime_process_rewards", "prime_prm_loss", "register_estimator", "rollout_correction", "register_policy_loss",
    "scores_to_token_rewards", "spin_loss", "sppo_loss", "sum_pi_squared_from_logits", "value_loss", "win_rates",
]
