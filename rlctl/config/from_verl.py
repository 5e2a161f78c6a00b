"""`rlctl config from-verl`: a verl launch's overrides -> rlctl.toml, every key accounted for.

RULES is the one mapping: each verl key (or family of keys, `prefix.*`) with rlctl's key and how
the value converts, or the reason rlctl does not honour it. docs/verl.md's key table is generated
from it (tests/config/test_from_verl.py keeps the page and the table equal). The plain renames come
from rlctl.config.verl_names (the did-you-mean table), the rest is spelled out here.

verl's defaults that differ from rlctl's are written too when the launch relied on them
(VERL_DEFAULTS): a verl run without `algorithm.adv_estimator` is GAE, with 1,024 prompts a step.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any, Callable

from rlctl.config.verl_names import VERL_KEYS
from rlctl.config.verl_script import Launch
from rlctl.errors import UsageError

_A = "actor_rollout_ref"


@dataclass(frozen=True)
class Rule:
    verl: str                         # verl's key, or a family "prefix.*"
    rlctl: str = ""                   # rlctl's key ("" = not honoured)
    convert: Callable | None = None   # (value, the launch's values) -> rlctl's value, or None to leave it unset
    why: str = ""                     # not honoured: the reason; honoured: what differs


def parse_value(text: str) -> Any:
    """A hydra override value: true/false, null, numbers, [a, b] lists, quoted or bare strings."""
    t = text.strip()
    if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"":
        return t[1:-1]
    if t.lower() in ("true", "false"):
        return t.lower() == "true"
    if t.lower() in ("null", "none", "~"):
        return None
    if t.startswith("[") and t.endswith("]"):
        inner = t[1:-1].strip()
        return [parse_value(p) for p in inner.split(",")] if inner else []
    for kind in (int, float):
        try:
            return kind(t)
        except ValueError:
            pass
    return t


def _files(value, _):
    return [value] if isinstance(value, str) else value


def _never_is_zero(value, _):
    return 0 if isinstance(value, int) and value < 0 else value


def _loggers(value, _):
    names = [value] if isinstance(value, str) else list(value or [])
    kept = [n for n in names if n in ("console", "wandb", "tensorboard")]
    return kept + ["jsonl"]   # metrics.jsonl feeds rlctl status and rlctl view


def _token_budget(flag_key: str, length_key: str, verl_default: int):
    def convert(value, values):
        if not values.get(flag_key, False):
            return None
        return int(values.get(length_key, verl_default))
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


_SPECIAL = (
    Rule("data.train_files", "data.train_files", _files),
    Rule("data.val_files", "data.val_files", _files),
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
    Rule("trainer.save_freq", "run.save_every", _never_is_zero, "-1 (never) is 0 (only at the end)"),
    Rule("trainer.test_freq", "run.val_every", _never_is_zero, "-1 (never) is 0 (only at the end)"),
    Rule("trainer.logger", "run.loggers", _loggers, "console / wandb / tensorboard kept, jsonl added"),
    Rule("trainer.total_training_steps", "run.total_steps", lambda v, _: v or None),
    Rule("trainer.project_name", "", why="rlctl names a run by run.name only (wandb's project: WANDB_PROJECT)"),
    Rule("trainer.resume_mode", "", why="resume a run with `rlctl resume RUN_DIR`"),
    Rule("trainer.device", "", why="rlctl uses the GPUs it finds, else the CPU"),
    Rule("trainer.balance_batch", "", why="rlctl balances tokens across workers with actor.micro_batch_max_tokens"),
    Rule("trainer.log_val_generations", "", why="rlctl writes run.log_samples prompt/response pairs per step"),
    Rule("trainer.val_only", "", why="score a model with `rlctl eval MODEL --data FILE`"),
    Rule("trainer.use_legacy_worker_impl", "", why="verl's worker implementation switch; rlctl has one"),
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
    Rule(f"{_A}.model.use_remove_padding", why="rlctl always packs sequences without padding"),
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
    Rule("critic.model.use_remove_padding", why="rlctl always packs sequences without padding"),
    Rule("critic.model.enable_gradient_checkpointing", why="the critic follows model.gradient_checkpointing"),
    Rule("global_profiler.*", why="no profiler hooks in rlctl"),
    Rule("ray_kwargs.*", why="rlctl starts Ray itself (resources.address to join a cluster)"),
    Rule("ray_init.*", why="rlctl starts Ray itself (resources.address to join a cluster)"),
    Rule("transfer_queue.*", why="not built in rlctl"),
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
# verl's clip_ratio is both bounds
_ALSO = {f"{_A}.actor.clip_ratio": "actor.clip_ratio_high"}


def rule_for(key: str) -> Rule | None:
    for rule in RULES:
        if rule.verl == key or (rule.verl.endswith(".*") and key.startswith(rule.verl[:-1])):
            return rule
    return None


@dataclass
class Conversion:
    values: dict            # rlctl key -> value
    sources: dict           # rlctl key -> the verl key (or "verl default") it came from
    not_honoured: list      # (verl key, value as written, why)


def convert(launch: Launch) -> Conversion:
    """Map every override; UsageError for a key rlctl does not know as verl's."""
    values = {key: parse_value(text) for key, text in launch.overrides}
    out, sources, skipped = {}, {}, []
    for key, text in launch.overrides:
        rule = rule_for(key)
        if rule is None:
            close = difflib.get_close_matches(key, [r.verl for r in RULES if not r.verl.endswith("*")], n=1)
            raise UsageError(f"unknown verl key {key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""),
                             hint="check the spelling against verl's trainer config; docs/verl.md lists every "
                                  "key rlctl reads.")
        if not rule.rlctl:
            skipped.append((key, text, rule.why))
            continue
        value = rule.convert(values[key], values) if rule.convert else values[key]
        if value is None:
            continue
        for target in (rule.rlctl, _ALSO.get(key)):
            if target:
                out[target], sources[target] = value, key
    for launch_key in launch.unresolved:
        skipped.append((launch_key, "$(...)", "its value comes from a shell command: set it by hand"))
    for option in launch.options:
        skipped.append((option, "", "hydra's own option: rlctl reads no verl YAML"))
    for target, (default, verl_key) in VERL_DEFAULTS.items():
        if target not in out and verl_key not in values:
            out[target], sources[target] = default, "verl default"
    return Conversion(out, sources, skipped)


def checked(conversion: Conversion) -> dict:
    """rlctl's values typed by its schema; UsageError naming the verl key of the first that does not fit."""
    from rlctl.config.loader import check_value
    from rlctl.config.loader import LEAF_KEYS

    typed = {}
    for key, value in conversion.values.items():
        field = LEAF_KEYS.get(key)
        if field is None:   # a target another change has not added to the schema yet
            conversion.not_honoured.append((conversion.sources[key], str(value), f"{key} is not in this rlctl yet"))
            continue
        value, errors = check_value(key, field, value)
        if errors:
            raise UsageError(f"{conversion.sources[key]}={value!r}: {errors[0]} (rlctl's {key})",
                             hint="fix the value in the verl script or pass key=value after it.")
        typed[key] = list(value) if isinstance(value, tuple) else value
    return typed


def to_toml(typed: dict, conversion: Conversion, origin: str) -> str:
    """The rlctl.toml text: the mapped keys by table, each commented with the verl key it came from,
    and the keys rlctl does not honour as comments at the top."""
    import tomlkit

    lines = [f"# converted by `rlctl config from-verl` from {origin}"]
    if conversion.not_honoured:
        lines.append("# verl keys rlctl does not honour (docs/verl.md says why):")
        lines += [f"#   {key}={value}: {why}".rstrip() for key, value, why in conversion.not_honoured]
    tables: dict[str, list[str]] = {}
    for key in sorted(typed, key=_section_order):
        table, leaf = key.rsplit(".", 1)
        item = tomlkit.item(typed[key]).as_string()
        tables.setdefault(table, []).append(f"{leaf} = {item}  # {conversion.sources[key]}")
    for table, entries in tables.items():
        lines += ["", f"[{table}]", *entries]
    return "\n".join(lines) + "\n"


_ORDER = ("run", "model", "data", "algorithm", "actor", "critic", "rollout", "reward", "resources")


def _section_order(key: str) -> tuple:
    head = key.split(".")[0]
    return (_ORDER.index(head) if head in _ORDER else len(_ORDER), key.rsplit(".", 1)[0], key)


def key_table() -> str:
    """docs/verl.md's key table (markdown), generated from RULES and VERL_DEFAULTS."""
    rows = ["| verl key | rlctl key | notes |", "|---|---|---|"]
    for rule in RULES:
        target = f"`{rule.rlctl}`" if rule.rlctl else "not honoured"
        also = f", `{_ALSO[rule.verl]}`" if rule.verl in _ALSO else ""
        rows.append(f"| `{rule.verl}` | {target}{also} | {rule.why} |")
    rows += ["", "verl's defaults written when a launch does not set the key (rlctl's default differs):", "",
             "| rlctl key | verl's default | verl key |", "|---|---|---|"]
    rows += [f"| `{key}` | `{default}` | `{verl}` |" for key, (default, verl) in VERL_DEFAULTS.items()]
    return "\n".join(rows) + "\n"
