"""verl's SFT trainers (`verl.trainer.fsdp_sft_trainer`, `verl.trainer.sft_trainer` under torchrun)
-> an SFT rlctl.toml (run.kind = "sft"): the rules `rlctl config from-verl` converts their keys by.

Same Rule shape as rlctl.config.verl_rules. verl's SFT config is flatter than its PPO one
(`optim.lr`, `model.partial_pretrain`, `data.micro_batch_size_per_gpu`); the GPU count comes from
torchrun's `--nproc_per_node` / `--nnodes` (or trainer.n_gpus_per_node for the engine trainer).
"""

from __future__ import annotations

from rlctl.config.verl_rules import Rule, files, loggers, never_is_zero


def _dict_keys(value, _):
    return [value] if isinstance(value, str) else list(value or [])


def _sft_budget(value, values):
    """data.use_dynamic_bsz (the engine trainer's default) packs micro-batches by token count."""
    if not values.get("data.use_dynamic_bsz", False):
        return None
    return int(values.get("data.max_token_len_per_gpu", 8192))


SFT_RULES = (
    Rule("data.train_files", "data.train_files", files),
    Rule("data.val_files", "data.val_files", files),
    Rule("data.train_batch_size", "data.batch_size", why="examples per optimizer step, over every GPU"),
    Rule("data.micro_batch_size_per_gpu", "actor.micro_batch_size"),
    Rule("data.micro_batch_size", why="verl's deprecated global size: set data.micro_batch_size_per_gpu"),
    Rule("data.prompt_key", "sft.prompt_key"),
    Rule("data.response_key", "sft.response_key"),
    Rule("data.prompt_dict_keys", "sft.prompt_dict_keys", _dict_keys),
    Rule("data.response_dict_keys", "sft.response_dict_keys", _dict_keys),
    Rule("data.multiturn.enable", why="rlctl reads the messages column whenever a file has it (sft.messages_key)"),
    Rule("data.multiturn.messages_key", "sft.messages_key"),
    Rule("data.multiturn.tools_key", "sft.tools_key"),
    Rule("data.messages_key", "sft.messages_key"),
    Rule("data.tools_key", "sft.tools_key"),
    Rule("data.max_length", "sft.max_length"),
    Rule("data.truncation", "sft.truncation"),
    Rule("data.use_dynamic_bsz", "sft.micro_batch_max_tokens", _sft_budget,
         "true: micro-batches of up to data.max_token_len_per_gpu tokens (8192 by default)"),
    Rule("data.max_token_len_per_gpu", "sft.micro_batch_max_tokens", lambda v, _: None, "with data.use_dynamic_bsz"),
    Rule("data.multiturn.enable_thinking_key", why="rlctl renders the chat template as the model ships it"),
    Rule("data.enable_thinking_key", why="rlctl renders the chat template as the model ships it"),
    Rule("data.*", why="a verl dataset knob rlctl does not have (it reads verl's parquet rows as they are)"),
    Rule("model.partial_pretrain", "model.path"),
    Rule("model.path", "model.path"),
    Rule("model.enable_gradient_checkpointing", "model.gradient_checkpointing"),
    Rule("model.trust_remote_code", "model.trust_remote_code"),
    Rule("model.lora_rank", "model.lora.rank"),
    Rule("model.lora_alpha", "model.lora.alpha"),
    Rule("model.target_modules", "model.lora.target_modules", _dict_keys),
    Rule("model.*", why="an FSDP / kernel knob (fsdp_config, use_liger, strategy, use_remove_padding): rlctl "
                        "shards with FSDP2 and picks its own"),
    Rule("optim.lr", "actor.lr"),
    Rule("optim.weight_decay", "actor.weight_decay"),
    Rule("optim.clip_grad", "actor.grad_clip"),
    Rule("optim.lr_scheduler", "actor.lr_schedule"),
    Rule("optim.warmup_style", "actor.lr_schedule"),
    Rule("optim.lr_scheduler_type", "actor.lr_schedule"),
    Rule("optim.lr_decay_style", "actor.lr_schedule"),
    Rule("optim.min_lr_ratio", "actor.min_lr_ratio"),
    Rule("optim.lr_warmup_steps", "actor.warmup_steps", lambda v, _: None if v is None or v < 0 else v),
    Rule("optim.lr_warmup_steps_ratio", why="rlctl counts warm-up in steps: set actor.warmup_steps"),
    Rule("optim.*", why="rlctl's AdamW keeps its own betas and takes no engine options"),
    Rule("optim", why="hydra's config group choice: rlctl reads no verl YAML"),
    Rule("ulysses_sequence_parallel_size", "actor.ulysses_sequence_parallel_size"),
    Rule("engine.ulysses_sequence_parallel_size", "actor.ulysses_sequence_parallel_size"),
    Rule("engine", why="hydra's config group choice: rlctl trains with FSDP2"),
    Rule("engine.*", why="an engine knob (FSDP strategy, Megatron parallel sizes): rlctl shards with FSDP2"),
    Rule("use_remove_padding", why="rlctl drops padding itself (packed or trimmed rows)"),
    Rule("trainer.default_local_dir", "run.output_dir"),
    Rule("trainer.experiment_name", "run.name"),
    Rule("trainer.total_epochs", "run.total_epochs"),
    Rule("trainer.total_training_steps", "run.total_steps", lambda v, _: v or None),
    Rule("trainer.logger", "run.loggers", loggers, "console / wandb / tensorboard kept, jsonl added"),
    Rule("trainer.seed", "run.seed"),
    Rule("trainer.save_freq", "run.save_every", never_is_zero, "-1 (never) is 0 (only at the end)"),
    Rule("trainer.test_freq", "run.val_every", never_is_zero, "-1 (never) is 0 (only at the end)"),
    Rule("trainer.max_ckpt_to_keep", "run.keep_last", lambda v, _: v or None),
    Rule("trainer.nnodes", "resources.nodes"),
    Rule("trainer.n_gpus_per_node", "resources.gpus_per_node"),
    Rule("trainer.project_name", why="rlctl names a run by run.name only (wandb's project: WANDB_PROJECT)"),
    Rule("trainer.resume_mode", why="resume a run with `rlctl resume RUN_DIR`"),
    Rule("trainer.*", why="a verl trainer knob rlctl does not have"),
    Rule("checkpoint.*", why="rlctl checkpoints model, optimizer and data state always"),
    Rule("profiler.*", why="no profiler hooks in rlctl"),
)

# verl's SFT defaults where rlctl's differ, written unless the launch sets the key: rlctl key -> (value, verl key)
SFT_DEFAULTS = {
    "data.batch_size": (256, "data.train_batch_size"),
    "actor.micro_batch_size": (4, "data.micro_batch_size_per_gpu"),
    "actor.lr": (1e-5, "optim.lr"),
    "actor.weight_decay": (0.01, "optim.weight_decay"),
    "actor.grad_clip": (1.0, "optim.clip_grad"),
    "actor.lr_schedule": ("cosine", "optim.lr_scheduler"),
    "run.total_epochs": (4, "trainer.total_epochs"),
    "run.seed": (1, "trainer.seed"),
    "model.gradient_checkpointing": (True, "model.enable_gradient_checkpointing"),
}
# fsdp_sft_trainer reads single-turn question/answer columns by default; the engine trainer (sft_trainer) reads
# messages and packs by tokens
FSDP_SFT_DEFAULTS = {"sft.prompt_key": ("question", "data.prompt_key"),
                     "sft.response_key": ("answer", "data.response_key")}
ENGINE_SFT_DEFAULTS = {"sft.micro_batch_max_tokens": (8192, "data.max_token_len_per_gpu"),
                       "resources.gpus_per_node": (1, "trainer.n_gpus_per_node")}


def torchrun_resources(launcher: list[str]) -> dict:
    """torchrun's `--nproc_per_node N` / `--nnodes N` (either spelling, `=` or a separate word)."""
    out, i = {}, 0
    names = {"--nproc_per_node": "resources.gpus_per_node", "--nproc-per-node": "resources.gpus_per_node",
             "--nnodes": "resources.nodes"}
    while i < len(launcher):
        word = launcher[i]
        name, sep, value = word.partition("=")
        if name in names:
            if not sep and i + 1 < len(launcher):
                value, i = launcher[i + 1], i + 1
            if value.isdigit():
                out[names[name]] = int(value)
        i += 1
    return out
