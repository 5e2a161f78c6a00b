"""The tables inside [algorithm] that shape which samples train and how they are weighted:
DAPO's dynamic sampling, PF-PPO's resampling, and the rollout-policy correction (verl's names).

Part of the schema (rlctl.config.schema re-exports each class); split out to keep modules small.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlctl.config.fields import opt
from rlctl.config.names import PF_PPO_REWEIGHT_METHODS


@dataclass(frozen=True)
class DynamicSamplingConfig:
    enable: bool = opt(False, "DAPO: keep only groups whose metric varies; regenerate to fill the batch.")
    metric: str = opt("score", "Per-sample metric the filter reads: its spread within a group (or its group mean "
                                "with filter_accuracy).", choices=("score", "acc"))
    max_gen_batches: int = opt(4, "Generation rounds per step before training on what there is (verl PRIME's "
                                  "oversample_factor).", ge=1)
    filter_accuracy: bool = opt(False, "PRIME's accuracy filter: keep a group whose mean acc lies in "
                                       "[accuracy_lower_bound, accuracy_upper_bound], ends included, instead of "
                                       "one whose metric varies; needs metric = \"acc\".")
    accuracy_lower_bound: float = opt(0.2, "filter_accuracy: the lowest mean acc kept.", ge=0, le=1)
    accuracy_upper_bound: float = opt(0.8, "filter_accuracy: the highest mean acc kept.", ge=0, le=1)
    filter_truncate: bool = opt(False, "Also drop a group any of whose responses ran out of "
                                       "data.max_response_length before an EOS (PRIME's filter_truncate).")


@dataclass(frozen=True)
class PfPpoConfig:
    reweight_method: str = opt("pow", "PF-PPO weights of a prompt's samples: \"pow\" (|score|^weight_pow), \"max_min\" "
                                      "(best and worst), \"max_random\" (0.4 best, 0.1 others).", choices=PF_PPO_REWEIGHT_METHODS)
    weight_pow: float = opt(2.0, "PF-PPO \"pow\": the power of |score|.", ge=0)


@dataclass(frozen=True)
class RolloutCorrectionConfig:
    rollout_is: str = opt("auto", "Truncated importance sampling of the rollout engine's samples: per \"token\" or "
                                  "\"sequence\" (empty = off; \"auto\" = off, or \"sequence\" (verl's default) "
                                  "with rollout.mode = \"one_step_off\" or \"async\").", choices=("auto", "", "token", "sequence"))
    rollout_is_threshold: float = opt(2.0, "Upper bound of the IS weights (truncation).", gt=0)
    rollout_is_batch_normalize: bool = opt(False, "Rescale the truncated weights to mean 1 over the batch.")
    rollout_rs: str = opt("", "Rejection (masked IS): comma-separated token_k1/2/3, seq_sum_k1/2/3, seq_mean_k1/2/3, "
                              "seq_max_k2/3 (empty = off).")
    rollout_rs_threshold: str = opt("", "Bounds for rollout_rs, one shared or one per option: \"lower_upper\" ratio "
                                        "bounds for k1 options (e.g. \"0.5_2.0\"), an upper bound otherwise.")
    bypass_mode: bool = opt(False, "verl's bypass mode: old_log_prob is the rollout's own log-prob (no recompute "
                                   "pass); correction runs inside the loss against the current policy. Needs rollout "
                                   "log-probs: rollout.mode = \"one_step_off\" or \"async\", or vLLM/SGLang.")
    loss_type: str = opt("ppo_clip", "bypass_mode's loss (replaces actor.policy_loss): \"ppo_clip\" (PPO ratio "
                                     "pi / pi_rollout, clipped) or \"reinforce\" (-w A log pi with the IS weights).",
                         choices=("ppo_clip", "reinforce"))
