"""verl's config names -> rlctl's, for "did you mean" on an unknown key.

A verl user types `actor_rollout_ref.actor.optim.lr=1e-6` or `data.train_batch_size=256`; spelling
distance would offer an unrelated key (`actor.kl_loss_coef`), so the names verl users know are
looked up first. A target missing from the schema is never offered.
"""

from __future__ import annotations

_ARR = "actor_rollout_ref"
VERL_KEYS = {
    f"{_ARR}.actor.optim.lr": "actor.lr",
    f"{_ARR}.actor.optim.lr_warmup_steps": "actor.warmup_steps",
    f"{_ARR}.actor.optim.weight_decay": "actor.weight_decay",
    f"{_ARR}.actor.grad_clip": "actor.grad_clip",
    f"{_ARR}.actor.ppo_epochs": "actor.ppo_epochs",
    f"{_ARR}.actor.ppo_mini_batch_size": "actor.mini_batch_size",
    f"{_ARR}.actor.ppo_micro_batch_size_per_gpu": "actor.micro_batch_size",
    f"{_ARR}.actor.clip_ratio_low": "actor.clip_ratio_low",
    f"{_ARR}.actor.clip_ratio_high": "actor.clip_ratio_high",
    f"{_ARR}.actor.clip_ratio_c": "actor.clip_ratio_c",
    f"{_ARR}.actor.loss_agg_mode": "actor.loss_agg_mode",
    f"{_ARR}.actor.entropy_coeff": "actor.entropy_coef",
    f"{_ARR}.actor.use_kl_loss": "actor.use_kl_loss",
    f"{_ARR}.actor.kl_loss_coef": "actor.kl_loss_coef",
    f"{_ARR}.actor.kl_loss_type": "actor.kl_loss_type",
    f"{_ARR}.actor.ulysses_sequence_parallel_size": "actor.ulysses_sequence_parallel_size",
    # verl's dynamic batch size: one token budget per worker here (0 = off) for all of the policy's passes
    f"{_ARR}.actor.use_dynamic_bsz": "actor.micro_batch_max_tokens",
    f"{_ARR}.actor.ppo_max_token_len_per_gpu": "actor.micro_batch_max_tokens",
    f"{_ARR}.rollout.log_prob_use_dynamic_bsz": "actor.micro_batch_max_tokens",
    f"{_ARR}.rollout.log_prob_max_token_len_per_gpu": "actor.micro_batch_max_tokens",
    f"{_ARR}.ref.log_prob_use_dynamic_bsz": "actor.micro_batch_max_tokens",
    f"{_ARR}.ref.log_prob_max_token_len_per_gpu": "actor.micro_batch_max_tokens",
    "critic.use_dynamic_bsz": "critic.micro_batch_max_tokens",
    "critic.ppo_max_token_len_per_gpu": "critic.micro_batch_max_tokens",
    "critic.forward_max_token_len_per_gpu": "critic.micro_batch_max_tokens",
    f"{_ARR}.model.path": "model.path",
    f"{_ARR}.model.enable_gradient_checkpointing": "model.gradient_checkpointing",
    f"{_ARR}.model.lora_rank": "model.lora.rank",
    f"{_ARR}.model.lora_alpha": "model.lora.alpha",
    f"{_ARR}.model.target_modules": "model.lora.target_modules",
    f"{_ARR}.rollout.name": "rollout.engine",
    f"{_ARR}.rollout.n": "rollout.n",
    f"{_ARR}.rollout.temperature": "rollout.temperature",
    f"{_ARR}.rollout.top_p": "rollout.top_p",
    f"{_ARR}.rollout.top_k": "rollout.top_k",
    f"{_ARR}.rollout.gpu_memory_utilization": "rollout.gpu_memory_utilization",
    f"{_ARR}.rollout.tensor_model_parallel_size": "rollout.tensor_parallel_size",
    f"{_ARR}.rollout.val_kwargs.temperature": "rollout.val_temperature",
    "data.train_batch_size": "data.batch_size",
    "algorithm.adv_estimator": "algorithm.name",
    "algorithm.use_kl_in_reward": "algorithm.kl_in_reward",
    "algorithm.kl_ctrl.kl_coef": "algorithm.kl_coef",
    "algorithm.kl_penalty": "algorithm.kl_type",
    "algorithm.norm_adv_by_std_in_grpo": "algorithm.norm_adv_by_std",
    "trainer.total_training_steps": "run.total_steps",
    "trainer.total_epochs": "run.total_epochs",
    "trainer.save_freq": "run.save_every",
    "trainer.test_freq": "run.val_every",
    "trainer.experiment_name": "run.name",
    "trainer.default_local_dir": "run.output_dir",
    "trainer.logger": "run.loggers",
    "trainer.max_actor_ckpt_to_keep": "run.keep_last",
    "trainer.n_gpus_per_node": "resources.gpus_per_node",
    "trainer.nnodes": "resources.nodes",
    "critic.optim.lr": "critic.lr",
    "critic.cliprange_value": "critic.value_clip",
    "custom_reward_function.path": "reward.function",
    "custom_reward_function.name": "reward.function",
    "reward_model.overlong_buffer.enable": "reward.overlong.enable",
    "reward_model.overlong_buffer.len": "reward.overlong.buffer_len",
    "reward_model.overlong_buffer.penalty_factor": "reward.overlong.penalty_factor",
    "data.filter_accuracy": "algorithm.dynamic_sampling.filter_accuracy",      # verl's PRIME recipe
    "data.accuracy_lower_bound": "algorithm.dynamic_sampling.accuracy_lower_bound",
    "data.accuracy_upper_bound": "algorithm.dynamic_sampling.accuracy_upper_bound",
    "data.filter_truncate": "algorithm.dynamic_sampling.filter_truncate",
    "data.oversample_factor": "algorithm.dynamic_sampling.max_gen_batches",
}

# The last word of a key as TRL / torchtune / verl users write it -> rlctl's word in the same section.
WORD_SYNONYMS = {"learning_rate": "lr", "lr_warmup_steps": "warmup_steps", "entropy_coeff": "entropy_coef",
                 "ppo_mini_batch_size": "mini_batch_size", "ppo_micro_batch_size": "micro_batch_size",
                 "train_batch_size": "batch_size", "max_grad_norm": "grad_clip", "num_generations": "n",
                 "beta": "kl_loss_coef", "epsilon": "clip_ratio_low", "max_steps": "total_steps",
                 "num_train_epochs": "total_epochs", "save_steps": "save_every", "seed_value": "seed",
                 "use_dynamic_bsz": "micro_batch_max_tokens", "ppo_max_token_len_per_gpu": "micro_batch_max_tokens",
                 "log_prob_max_token_len_per_gpu": "micro_batch_max_tokens"}


def known_rename(key: str, schema_keys) -> str | None:
    """rlctl's key for `key` when it is a verl name (or a known synonym in the right section)."""
    target = VERL_KEYS.get(key)
    if target is None:
        section, _, word = key.rpartition(".")
        target = f"{section}.{WORD_SYNONYMS[word]}" if word in WORD_SYNONYMS else None
    return target if target in schema_keys else None
