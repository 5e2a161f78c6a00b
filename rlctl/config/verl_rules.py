"""verl's config keys and what rlctl does with each: the table `rlctl config from-verl` converts by
(rlctl.config.from_verl) and docs/verl.md's key table is generated from.

Each Rule is a verl key (or a family of keys, `prefix.*`) with rlctl's key and how the value
converts, or the reason rlctl does not honour it. rlctl = SAME: the key has the same name in rlctl
(`algorithm.rollout_correction.*`). The plain renames come from rlctl.config.verl_names (the
did-you-mean table); the rest is spelled out here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from rlctl.config.verl_names import VERL_KEYS

_A = "actor_rollout_ref"
SAME = "="   # rlctl's key is verl's


@dataclass(frozen=True)
class Rule:
    verl: str                         # verl's key, or a family "prefix.*"
    rlctl: str = ""                   # rlctl's key ("" = not honoured)
    convert: Callable | None = None   # (value, the launch's values) -> rlctl's value, or None to leave it unset
    why: str = ""                     # not honoured: the reason; honoured: what differs


def files(value, _):
    return [value] if isinstance(value, str) else value


def never_is_zero(value, _):
    return 0 if isinstance(value, int) and value < 0 else value


def loggers(value, _):
    names = [value] if isinstance(value, str) else list(value or [])
    kept = [n for n in names if n in ("console", "wandb", "tensorboard")]
    return kept + ["jsonl"]   # metrics.jsonl feeds rlctl status and rlctl view


def _token_budget(flag_key: str, length_key: str, verl_default: int):
    def convert(value, values):
        if not values.get(flag_key, False):
            return None
        length = values.get(length_key)
        return int(length) if isinstance(length, int) else verl_default   # "" (an unset variable): verl's default
    return convert


def _reward_function(value, values):
    path = values.get("custom_reward_function.path")
    if not path:
        return None
    return f"{path}:{values.get('custom_reward_function.name') or 'compute_score'}"


def _overlong(prefix: str, leaf: str):
    return Rule(f"{prefix}.{leaf}", f"reward.overlong.{ {'len': 'buffer_len'}.get(leaf, leaf) }")


def _overlong_prompts(value, values):
    if value:
        return "filter"
    return "error" if values.get("data.truncation", "error") == "error" else "truncate"


def _val_temperature(value, values):
    if values.get(f"{_A}.rollout.val_kwargs.do_sample") is False:
        return 0.0
    return values.get(f"{_A}.rollout.val_kwargs.temperature", 0.0)


def _top_k(value, _):
    return 0 if value is None or value < 0 else value


def _warmup(value, _):
    return None if value is None or value < 0 else value


def _dtype(value, _):
    return {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "half": "float16", "float": "float32"}.get(
        str(value).lower(), value)


def _router_replay(value, _):
    return str(value).upper() in ("R2", "R3")   # R2: the log-prob pass's routing, R3: the rollout's


def _is_upper(value, _):
    """rollout_is_threshold: a number, or verl's "lower_upper" string (the upper bound truncates)."""
    if isinstance(value, str) and "_" in value:
        return float(value.rsplit("_", 1)[1])
    return value


def _as_list(value, _):
    return [value] if isinstance(value, (str, int, float)) else list(value or [])


def _distill_on(values: dict) -> bool:
    return any(values.get(f"{p}.{flag}") is True for p in (f"{_A}.distillation", "distillation")
               for flag in ("enabled", "enable"))


def _if_distill(value, values):
    return value if _distill_on(values) else None


_DISTILL_LOSSES = {"k1": "k1", "k3": "k3", "low_var_kl": "k3", "forward_kl_topk": "forward_kl_topk",
                   "forward_kl": "forward_kl_topk", "jsd": "jsd", "jsd_topk": "jsd"}


def _distill_loss(value, values):
    """verl's distillation loss_mode -> distill.loss; verl's reverse-KL modes are rlctl's k1 (policy gradient)."""
    if not _distill_on(values):
        return None
    return _DISTILL_LOSSES.get(str(value).rstrip("+"), "k1")


def _distill_rules(prefix: str) -> tuple:
    return (Rule(f"{prefix}.enabled", "", why="turns [distill] on (distill.teacher is written)"),
            Rule(f"{prefix}.enable", "", why="turns [distill] on (distill.teacher is written)"),
            Rule(f"{prefix}.teacher_model.path", "distill.teacher", _if_distill),
            Rule(f"{prefix}.teacher_model.model_path", "distill.teacher", _if_distill),
            Rule(f"{prefix}.loss_mode", "distill.loss", _distill_loss,
                 "k3 / forward_kl_topk / jsd(_topk) kept; verl's reverse-KL modes are rlctl's k1 (policy gradient)"),
            Rule(f"{prefix}.jsd_beta", "distill.beta", _if_distill),
            Rule(f"{prefix}.topk", "distill.topk", _if_distill),
            Rule(f"{prefix}.*", why="rlctl's teacher runs beside the trainer with the student's settings "
                                    "(no separate micro-batches, Megatron or engine for it)"))


_SPECIAL = (
    Rule("data.train_files", "data.train_files", files),
    Rule("data.val_files", "data.val_files", files),
    Rule("data.val_batch_size", "data.val_batch_size"),
    Rule("data.shuffle", "data.shuffle"),
    Rule("data.max_prompt_length", "data.max_prompt_length"),
    Rule("data.max_response_length", "data.max_response_length"),
    Rule("data.filter_overlong_prompts", "data.overlong_prompts", _overlong_prompts,
         "true -> \"filter\"; false -> \"error\" (or \"truncate\" with data.truncation left/right)"),
    Rule("data.truncation", "", why="read with data.filter_overlong_prompts"),
    Rule("data.gen_batch_size", "", why="DAPO's generation batch: rlctl generates data.batch_size prompts a round, "
                                        "up to algorithm.dynamic_sampling.max_gen_batches rounds"),
    Rule("data.prompt_key", "", why="rlctl reads the `prompt` column (verl's default)"),
    Rule("data.reward_fn_key", "", why="rlctl reads the `data_source` column (verl's default)"),
    Rule("data.return_raw_chat", "", why="rlctl always renders the chat template itself"),
    Rule(f"{_A}.actor.optim.lr_warmup_steps", "actor.warmup_steps", _warmup, "-1 (verl: use the ratio) is left out"),
    Rule(f"{_A}.actor.optim.lr_warmup_steps_ratio", "", why="rlctl counts warm-up in steps: set actor.warmup_steps"),
    Rule(f"{_A}.actor.optim.warmup_style", "actor.lr_schedule"),
    Rule(f"{_A}.actor.optim.lr_scheduler_type", "actor.lr_schedule"),
    Rule(f"{_A}.actor.clip_ratio", "actor.clip_ratio_low", None, "verl's shared bound sets clip_ratio_low "
                                                                       "(and _high below)"),
    Rule(f"{_A}.actor.policy_loss.loss_mode", "actor.policy_loss"),
    Rule(f"{_A}.actor.use_dynamic_bsz", "actor.micro_batch_max_tokens",
         _token_budget(f"{_A}.actor.use_dynamic_bsz", f"{_A}.actor.ppo_max_token_len_per_gpu", 16384),
         "true: the budget is ppo_max_token_len_per_gpu (16384 by default); one budget for every pass"),
    Rule(f"{_A}.actor.ppo_max_token_len_per_gpu", "actor.micro_batch_max_tokens", lambda v, _: None,
         "with use_dynamic_bsz = true"),
    Rule(f"{_A}.rollout.log_prob_use_dynamic_bsz", "", why="rlctl's log-prob passes use actor.micro_batch_max_tokens"),
    Rule(f"{_A}.rollout.log_prob_max_token_len_per_gpu", "", why="rlctl's log-prob passes use "
                                                                  "actor.micro_batch_max_tokens"),
    Rule(f"{_A}.ref.log_prob_use_dynamic_bsz", "", why="rlctl's reference pass uses actor.micro_batch_max_tokens"),
    Rule(f"{_A}.ref.log_prob_max_token_len_per_gpu", "", why="rlctl's reference pass uses actor.micro_batch_max_tokens"),
    Rule("critic.use_dynamic_bsz", "critic.micro_batch_max_tokens",
         _token_budget("critic.use_dynamic_bsz", "critic.ppo_max_token_len_per_gpu", 32768),
         "true: the budget is critic.ppo_max_token_len_per_gpu (32768 by default)"),
    Rule("critic.ppo_max_token_len_per_gpu", "critic.micro_batch_max_tokens", lambda v, _: None,
         "with critic.use_dynamic_bsz = true"),
    Rule("critic.forward_max_token_len_per_gpu", "", why="rlctl's value pass uses critic.micro_batch_max_tokens"),
    Rule(f"{_A}.rollout.log_prob_micro_batch_size_per_gpu", "", why="rlctl's log-prob passes use "
                                                                    "actor.micro_batch_size"),
    Rule(f"{_A}.ref.log_prob_micro_batch_size_per_gpu", "", why="rlctl's reference pass uses actor.micro_batch_size"),
    Rule(f"{_A}.rollout.top_k", "rollout.top_k", _top_k, "-1 (off) is 0"),
    Rule(f"{_A}.rollout.val_kwargs.temperature", "rollout.val_temperature", _val_temperature),
    Rule(f"{_A}.rollout.val_kwargs.do_sample", "rollout.val_temperature", _val_temperature, "false -> 0 (greedy)"),
    Rule(f"{_A}.rollout.val_kwargs.n", "rollout.val_n"),
    Rule(f"{_A}.rollout.val_kwargs.top_p", "", why="rlctl validates with rollout.top_p"),
    Rule(f"{_A}.rollout.val_kwargs.top_k", "", why="rlctl validates with rollout.top_k"),
    Rule(f"{_A}.rollout.enforce_eager", "rollout.enforce_eager"),
    Rule(f"{_A}.rollout.mode", "", why="verl's async server mode is how its engine is driven; rlctl's rollout.mode "
                                       "is off-policy scheduling (sync is verl's behaviour)"),
    Rule(f"{_A}.rollout.calculate_log_probs", "", why="rlctl decides from the loss what log-probs it needs"),
    Rule(f"{_A}.rollout.max_num_batched_tokens", "", why="a vLLM engine knob rlctl sets itself"),
    Rule(f"{_A}.rollout.max_model_len", "", why="rlctl sizes the engine from data.max_prompt_length + "
                                                "data.max_response_length"),
    Rule("algorithm.filter_groups.enable", "algorithm.dynamic_sampling.enable"),
    Rule("algorithm.filter_groups.metric", "algorithm.dynamic_sampling.metric"),
    Rule("algorithm.filter_groups.max_num_gen_batches", "algorithm.dynamic_sampling.max_gen_batches"),
    Rule("algorithm.kl_ctrl.type", "algorithm.kl_ctrl"),
    Rule("algorithm.kl_ctrl.target_kl", "algorithm.kl_target"),
    Rule("algorithm.kl_ctrl.horizon", "algorithm.kl_horizon"),
    Rule("algorithm.gamma", "algorithm.gamma"),
    Rule("algorithm.lam", "algorithm.lam"),
    Rule("algorithm.use_pf_ppo", "algorithm.use_pf_ppo"),
    Rule("custom_reward_function.path", "reward.function", _reward_function, "path:name, resolved from the "
                                                                              "config file's folder"),
    Rule("custom_reward_function.name", "reward.function", lambda v, _: None, "with custom_reward_function.path"),
    Rule("reward_model.reward_manager", "", why="rlctl's reward runner covers naive / dapo / prime (overlong "
                                                "shaping is reward.overlong)"),
    Rule("reward_model.enable", "", why="a reward model is reward.model = PATH in rlctl"),
    Rule("reward_model.launch_reward_fn_async", "", why="rlctl scores in its own process pool"),
    *(_overlong(p, leaf) for p in ("reward_model.overlong_buffer", "reward_model.reward_kwargs.overlong_buffer_cfg")
      for leaf in ("enable", "len", "penalty_factor")),
    Rule("reward_model.reward_kwargs.overlong_buffer_cfg.log", "", why="rlctl logs the overlong share always"),
    Rule("reward_model.reward_kwargs.max_resp_len", "", why="rlctl's overlong shaping reads data.max_response_length"),
    Rule("trainer.val_before_train", "run.val_before_train"),
    Rule("trainer.critic_warmup", "critic.pretrain_steps"),
    Rule("trainer.save_freq", "run.save_every", never_is_zero, "-1 (never) is 0 (only at the end)"),
    Rule("trainer.test_freq", "run.val_every", never_is_zero, "-1 (never) is 0 (only at the end)"),
    Rule("trainer.logger", "run.loggers", loggers, "console / wandb / tensorboard kept, jsonl added"),
    Rule("trainer.total_training_steps", "run.total_steps", lambda v, _: v or None),
    Rule("trainer.project_name", "", why="rlctl names a run by run.name only (wandb's project: WANDB_PROJECT)"),
    Rule("trainer.resume_mode", "", why="resume a run with `rlctl resume RUN_DIR`"),
    Rule("trainer.device", "", why="rlctl uses the GPUs it finds, else the CPU"),
    Rule("trainer.balance_batch", "", why="rlctl balances tokens across workers with actor.micro_batch_max_tokens"),
    Rule("trainer.log_val_generations", "", why="rlctl writes run.log_samples prompt/response pairs per step"),
    Rule("trainer.val_only", "", why="score a model with `rlctl eval MODEL --data FILE`"),
    Rule("trainer.use_legacy_worker_impl", "", why="verl's worker implementation switch; rlctl has one"),
    Rule("trainer.resume_from_path", "", why="resume a run with `rlctl resume RUN_DIR --step N`"),
    Rule("trainer.max_critic_ckpt_to_keep", "", why="run.keep_last keeps the critic with the actor"),
    Rule("data.image_key", "data.image_key"),
    Rule("data.trust_remote_code", "model.trust_remote_code"),
    Rule(f"{_A}.model.trust_remote_code", "model.trust_remote_code"),
    Rule(f"{_A}.rollout.prompt_length", "", why="rlctl's engine takes data.max_prompt_length"),
    Rule(f"{_A}.rollout.response_length", "", why="rlctl's engine takes data.max_response_length"),
    Rule(f"{_A}.actor.optim.clip_grad", "actor.grad_clip"),
    Rule(f"{_A}.rollout.enable_rollout_routing_replay", "actor.router_replay",
         why="rlctl replays the experts the rollout routed to in the update"),
    Rule(f"{_A}.actor.policy_loss.*", "actor.loss_params", why="[actor.loss_params] of the loss, verl's names"),
    Rule("critic.model.path", "critic.model_path"),
    Rule("critic.ppo_micro_batch_size_per_gpu", "critic.micro_batch_size"),
    Rule("critic.ppo_mini_batch_size", "critic.mini_batch_size"),
    Rule("critic.ppo_epochs", "critic.ppo_epochs"),
    Rule("critic.grad_clip", "critic.grad_clip"),
    Rule("critic.optim.lr_warmup_steps", "critic.warmup_steps", _warmup),
    Rule("critic.optim.weight_decay", "critic.weight_decay"),
    Rule("critic.loss_agg_mode", "critic.loss_agg_mode"),
    Rule("critic.ulysses_sequence_parallel_size", "critic.ulysses_sequence_parallel_size"),
    Rule("critic.enable", "", why="the estimator decides: gae trains a critic"),
    Rule("algorithm.rollout_correction.*", SAME, why="verl's names"),
    Rule("algorithm.pf_ppo.*", SAME, why="verl's names"),
    *(_overlong("reward.reward_kwargs.overlong_buffer_cfg", leaf) for leaf in ("enable", "len", "penalty_factor")),
    Rule("reward.reward_kwargs.overlong_buffer_cfg.log", "", why="rlctl logs the overlong share always"),
    Rule("reward.reward_kwargs.max_resp_len", "", why="rlctl's overlong shaping reads data.max_response_length"),
    Rule("reward.reward_manager.*", "", why="rlctl's reward runner covers naive / dapo / prime"),
    Rule("reward.reward_kwargs.*", "", why="a reward manager's keyword (verl's naive manager does not pass it to "
                                           "compute_score); rlctl's built-in scorers take reward.format_score"),
    Rule("reward.custom_reward_function.path", "reward.function", _reward_function, "path:name"),
    Rule("reward.custom_reward_function.name", "reward.function", lambda v, _: None, "with its path"),
    Rule("reward.num_workers", "reward.workers"),
    Rule("reward.reward_model.model_path", "reward.model"),
    Rule("reward.reward_model.enable", "", why="reward.model = PATH turns the reward model on"),
    Rule(f"{_A}.actor.optim.lr_decay_style", "actor.lr_schedule"),
    Rule(f"{_A}.actor.optim.min_lr", "", why="rlctl's cosine floor is actor.min_lr_ratio (a share of actor.lr)"),
    Rule(f"{_A}.actor.optim.betas", "", why="rlctl's AdamW keeps its default betas"),
    Rule(f"{_A}.model.lora.rank", "model.lora.rank"),
    Rule(f"{_A}.model.lora.alpha", "model.lora.alpha"),
    Rule(f"{_A}.model.lora.*", "", why="rlctl's LoRA takes rank, alpha, dropout and target_modules"),
    Rule(f"{_A}.model.lora_adapter_path", "", why="start from a merged model (rlctl merge --lora merge)"),
    Rule(f"{_A}.model.exclude_modules", "", why="list the layers that get adapters in model.lora.target_modules"),
    Rule("trainer.ref_update_freq", "algorithm.ref_update_every"),
    Rule(f"{_A}.model.torch_dtype", "model.dtype", _dtype),
    Rule(f"{_A}.actor.freeze_vision_tower", "model.freeze_vision_tower"),
    Rule(f"{_A}.actor.router_replay.mode", "actor.router_replay", _router_replay,
         "R2 / R3 -> true (rlctl replays the routing the rollout or log-prob pass chose)"),
    Rule(f"{_A}.actor.router_replay.*", why="rlctl records and replays routing itself"),
    Rule(f"{_A}.actor.tau_pos", "actor.loss_params", why="SAPO's gate temperature, [actor.loss_params]"),
    Rule(f"{_A}.actor.tau_neg", "actor.loss_params", why="SAPO's gate temperature, [actor.loss_params]"),
    Rule("algorithm.rollout_correction.rollout_is_threshold", "algorithm.rollout_correction.rollout_is_threshold",
         _is_upper, "verl's \"lower_upper\" string: the upper bound truncates the weights (as verl's IS does)"),
    Rule("algorithm.gdpo_reward_keys", "algorithm.params", _as_list, "[algorithm.params] reward_keys of gdpo"),
    Rule("algorithm.gdpo_reward_weights", "algorithm.params", _as_list, "[algorithm.params] reward_weights of gdpo"),
    *_distill_rules(f"{_A}.distillation"),
    *_distill_rules("distillation"),
    Rule("critic.model.trust_remote_code", "", why="the critic loads with model.trust_remote_code"),
    Rule("critic.optim.lr_warmup_steps_ratio", "", why="rlctl counts warm-up in steps: set critic.warmup_steps"),
    Rule("critic.optim.*", "", why="rlctl's AdamW for the critic takes lr, warmup_steps and weight_decay"),
    Rule("critic.profiler.*", "", why="no profiler hooks in rlctl"),
    Rule("reward_model.overlong_buffer.log", "", why="rlctl logs the overlong share always"),
)
# whole families of engine and cluster knobs with no rlctl equivalent
_FAMILIES = (
    Rule(f"{_A}.actor.fsdp_config.*", why="rlctl shards with FSDP2 and picks its own offload / wrap settings"),
    Rule(f"{_A}.ref.fsdp_config.*", why="rlctl shards with FSDP2 and picks its own settings"),
    Rule("critic.model.fsdp_config.*", why="rlctl shards with FSDP2 and picks its own settings"),
    Rule(f"{_A}.actor.checkpoint.*", why="rlctl checkpoints model, optimizer and data state always"),
    Rule(f"{_A}.actor.megatron.*", why="rlctl trains with FSDP2, not Megatron"),
    Rule(f"{_A}.rollout.engine_kwargs.*", why="engine-specific knobs rlctl sets itself"),
    Rule(f"{_A}.rollout.multi_turn.*", why="write [rollout.multi_turn] by hand (docs/multi-turn.md)"),
    Rule(f"{_A}.rollout.agent.*", why="write [rollout.agent] by hand (docs/agents.md)"),
    Rule(f"{_A}.model.override_config.*", why="rlctl loads the model's own config"),
    Rule(f"{_A}.model.use_remove_padding", why="rlctl drops padding itself (packed or trimmed rows)"),
    Rule(f"{_A}.model.use_fused_kernels", why="rlctl computes log-probs in row chunks itself"),
    Rule(f"{_A}.model.enable_activation_offload", why="not built in rlctl"),
    Rule(f"{_A}.model.use_shm", why="rlctl loads models from disk"),
    Rule(f"{_A}.hybrid_engine", why="rlctl co-locates the actor and its rollout always (resources.colocate)"),
    Rule(f"{_A}.actor.strategy", why="rlctl trains with FSDP2"),
    Rule(f"{_A}.actor.ppo_micro_batch_size", why="verl's deprecated global size: set ppo_micro_batch_size_per_gpu"),
    Rule(f"{_A}.rollout.enable_chunked_prefill", why="a vLLM engine knob rlctl sets itself"),
    Rule(f"{_A}.rollout.free_cache_engine", why="rlctl frees the engine's cache between phases itself"),
    Rule(f"{_A}.rollout.load_format", why="rlctl pushes weights to its engine itself"),
    Rule(f"{_A}.rollout.dtype", why="the engine runs in model.dtype"),
    Rule(f"{_A}.actor.use_torch_compile", why="not built in rlctl"),
    Rule(f"{_A}.actor.entropy_from_logits_with_chunking", why="rlctl always reads log-probs in row chunks"),
    Rule(f"{_A}.actor.entropy_checkpointing", why="not built in rlctl"),
    Rule("critic.strategy", why="rlctl trains with FSDP2"),
    Rule("critic.model.use_remove_padding", why="rlctl drops padding itself (packed or trimmed rows)"),
    Rule("critic.model.enable_gradient_checkpointing", why="the critic follows model.gradient_checkpointing"),
    Rule("global_profiler.*", why="no profiler hooks in rlctl"),
    Rule("ray_kwargs.*", why="rlctl starts Ray itself (resources.address to join a cluster)"),
    Rule("ray_init.*", why="rlctl starts Ray itself (resources.address to join a cluster)"),
    Rule("transfer_queue.*", why="not built in rlctl"),
    Rule(f"{_A}.ref.*", why="the reference shares the actor's settings in rlctl"),
    Rule(f"{_A}.actor.veomni.*", why="rlctl trains with FSDP2, not VeOmni"),
    Rule(f"{_A}.actor.engine.*", why="rlctl trains with FSDP2 and picks its own engine settings"),
    Rule(f"{_A}.actor.model_engine", why="rlctl trains with FSDP2"),
    Rule("model_engine", why="rlctl trains with FSDP2"),
    Rule(f"{_A}.actor.optim.override_optimizer_config.*", why="rlctl's AdamW takes no engine-specific options"),
    Rule(f"{_A}.actor.optim.optimizer", why="rlctl trains with AdamW"),
    Rule(f"{_A}.actor.profiler.*", why="no profiler hooks in rlctl"),
    Rule(f"{_A}.rollout.profiler.*", why="no profiler hooks in rlctl"),
    Rule(f"{_A}.rollout.checkpoint_engine.*", why="rlctl pushes weights to its engine itself"),
    Rule(f"{_A}.rollout.enable_prefix_caching", why="a vLLM engine knob rlctl sets itself"),
    Rule(f"{_A}.rollout.expert_parallel_size", why="rlctl's engine runs the model's experts whole"),
    Rule(f"{_A}.rollout.data_parallel_size", why="rlctl runs one engine per rollout rank"),
    Rule(f"{_A}.rollout.ignore_eos", why="rlctl stops at the end-of-sequence token"),
    Rule(f"{_A}.rollout.max_num_seqs", why="a vLLM engine knob rlctl sets itself"),
    Rule(f"{_A}.rollout.layered_summon", why="rlctl gathers weights for its engine itself"),
    Rule(f"{_A}.rollout.multi_stage_wake_up", why="rlctl wakes its engine itself"),
    Rule(f"{_A}.rollout.cudagraph_capture_sizes", why="a vLLM engine knob rlctl sets itself"),
    Rule(f"{_A}.model.mtp.*", why="multi-token prediction is not built in rlctl"),
    Rule(f"{_A}.nccl_timeout", why="rlctl sets its own collective timeouts"),
    Rule("data.filter_overlong_prompts_workers", why="rlctl filters prompts in one pass"),
    Rule("data.dataloader_num_workers", why="rlctl reads its prompts in the controller"),
    Rule("data.apply_chat_template_kwargs.*", why="rlctl renders the model's chat template as it is"),
    Rule("data.image_patch_size", why="rlctl reads it from the model's processor"),
    Rule("hydra.*", why="rlctl reads no verl YAML"),
    Rule("actor@actor_rollout_ref.actor", why="hydra's config group choice: rlctl reads no verl YAML"),
    Rule("critic.fsdp.*", why="rlctl shards with FSDP2 and picks its own settings"),
    Rule("critic.megatron.*", why="rlctl trains with FSDP2, not Megatron"),
    Rule("reward.reward_model.rollout.*", why="rlctl runs the reward model in its own workers"),
    Rule("data.custom_cls.*", why="rlctl reads verl's parquet rows; a custom dataset class is not loaded"),
    Rule(f"{_A}.actor.pad_to_length", why="rlctl drops padding itself (packed or trimmed rows)"),
    Rule(f"{_A}.actor.calculate_sum_pi_squared", why="not built in rlctl"),
    Rule(f"{_A}.actor.use_prefix_grouper", why="not built in rlctl"),
    Rule(f"{_A}.rollout.moe_tensor_parallel_size", why="rlctl's engine takes rollout.tensor_parallel_size"),
    Rule(f"{_A}.rollout.quantization", why="rlctl's engine runs in model.dtype"),
    Rule(f"{_A}.rollout.skip_tokenizer_init", why="a vLLM engine knob rlctl sets itself"),
    Rule(f"{_A}.rollout.log_prob_micro_batch_size", why="verl's deprecated global size: rlctl's log-prob passes use "
                                                        "actor.micro_batch_size"),
    Rule(f"{_A}.rollout.disable_log_stats", why="a vLLM engine knob rlctl sets itself"),
    Rule(f"{_A}.rollout.enable_sleep_mode", why="rlctl sleeps and wakes its engine itself"),
    Rule("data.min_response_length", why="not built in rlctl"),
    Rule("async_training.*", why="rlctl's asynchronous rollouts are rollout.mode = \"async\" (docs/async.md)"),
    Rule("trainer.tensorboard_dir", why="rlctl writes TensorBoard logs into the run folder"),
    Rule("trainer.rl_logging_board_dir", why="not built in rlctl"),
    Rule("trainer.rollout_data_dir", why="run.log_rollouts writes every sample into the run folder"),
    Rule("trainer.log_freq", why="rlctl logs every step"),
    Rule(f"{_A}.rollout.prometheus.*", why="rlctl's rollout exports no Prometheus metrics (see metrics.jsonl)"),
    Rule(f"{_A}.rollout.trace.*", why="rlctl writes run.log_rollouts into the run folder; no tracing backend"),
    Rule(f"{_A}.rollout.over_sample_rate", why="rlctl waits for every sample of a step (no over-sampling)"),
    Rule(f"{_A}.model.fused_kernel_options.*", why="rlctl computes log-probs in row chunks itself"),
    Rule(f"{_A}.model.external_lib", why="rlctl loads the model's own modeling code (model.trust_remote_code)"),
    Rule("critic.model.*", why="the critic loads like the actor (FSDP2, the actor's dtype and kernels)"),
    Rule("data.sampler.*", why="rlctl samples prompts in a seeded order; a curriculum sampler class is not loaded"),
    Rule("data.datagen.*", why="rlctl reads prompts from parquet; a data generator class is not loaded"),
    Rule("reward_model.*", why="a reward model is reward.model = PATH; PRIME's implicit PRM is [algorithm.params] "
                               "(docs/algorithms.md)"),
)
_PLAIN = tuple(Rule(verl, rlctl) for verl, rlctl in VERL_KEYS.items() if verl not in {r.verl for r in _SPECIAL})
RULES: tuple[Rule, ...] = _SPECIAL + _PLAIN + _FAMILIES

# rlctl key -> (verl's default, the verl key a launch sets it with): written when the launch did not set it
VERL_DEFAULTS = {
    "algorithm.name": ("gae", "algorithm.adv_estimator"),
    "data.batch_size": (1024, "data.train_batch_size"),
    "actor.mini_batch_size": (256, f"{_A}.actor.ppo_mini_batch_size"),
    "run.total_epochs": (30, "trainer.total_epochs"),
    "model.gradient_checkpointing": (True, f"{_A}.model.enable_gradient_checkpointing"),
    "run.val_before_train": (True, "trainer.val_before_train"),
    "data.train_files": (["~/data/rlhf/gsm8k/train.parquet"], "data.train_files"),
}
# a key the launch leaves empty (`trainer.n_gpus_per_node=$SLURM_GPUS_PER_NODE` outside Slurm) -> verl's own default
EMPTY_DEFAULTS = {"trainer.n_gpus_per_node": 8, "trainer.nnodes": 1}
# verl's clip_ratio is both bounds
ALSO_SETS = {f"{_A}.actor.clip_ratio": "actor.clip_ratio_high"}


