"""`rlctl config validate` and the start-up check of `rlctl train`: every check of a config, gathered.

`load_config` has already type-checked every key (pass 1). Here the checks each feature keeps
beside its code (rlctl.config.checks describes the contract) look at how keys fit together, and
in the second pass at the machine (files, model, GPUs, optional packages). Everything is collected
into one list of Problems, in a fixed order; nothing stops at the first one. A key that failed its
own type check keeps its default, and the rules about it are dropped: they would mislead.
"""

from __future__ import annotations

import dataclasses

from rlctl.config.checks import CheckContext
from rlctl.agent.checks import check_agent
from rlctl.config.loader import LoadedConfig, Problem
from rlctl.config.plan import BatchPlan, SFTPlan, sft_plan
from rlctl.data.checks import check_data_files, plan_with_rows, val_data_sources
from rlctl.data.image_checks import check_image_data
from rlctl.data.sft_checks import check_sft_batch, check_sft_keys, check_sft_section_unused
from rlctl.models.chat_template import check_chat_template
from rlctl.models.checks import check_model
from rlctl.multiturn.checks import check_multi_turn
from rlctl.rewards.checks import check_overlong, check_reward, check_reward_function, check_reward_model
from rlctl.rollouts.checks import (check_agent_template, check_environment_rows, check_rollout_images,
                                   check_rollout_kind)
from rlctl.runtime.checks import (check_cpu_split, check_cuda, check_gpu_workers, resolve_auto,
                                  resolve_auto_problems)
from rlctl.validate.selfplay import check_selfplay
from rlctl.validate.training import (check_algorithm, check_batches, check_best_metric, check_critic_pretrain,
                                     check_dynamic_sampling, check_kl, check_loggers, check_pf_ppo, check_registered,
                                     check_sft_best_metric)
from rlctl.workers.compute.lora_checks import check_lora, check_lora_targets
from rlctl.workers.rollout.adapter_sync_checks import check_adapter_sync
from rlctl.workers.compute.vision_checks import check_vision
from rlctl.workers.parallel.expert_checks import check_expert_model, check_expert_parallel, check_router_replay_model
from rlctl.workers.parallel.ulysses_checks import check_ulysses, check_ulysses_model
from rlctl.workers.roles.distill_checks import check_distill, check_distill_teachers
from rlctl.workers.roles.loss_checks import check_policy_loss, check_staleness_loss
from rlctl.workers.roles.prime_checks import check_prime, check_prime_model
from rlctl.workers.rollout.checks import check_engine_installed, check_one_step_off, check_rollout_engine

__all__ = ["RL_CHECKS", "RL_MACHINE_CHECKS", "SFT_CHECKS", "SFT_MACHINE_CHECKS", "resolve_auto", "validate"]

# The order here is the order problems are reported in (the machine checks run only in the
# second pass; the data files, which also fill the plan's rows, run just before them).
RL_CHECKS = (check_algorithm, check_dynamic_sampling, check_overlong, check_kl, check_policy_loss,
             check_staleness_loss, check_rollout_engine, check_one_step_off, check_lora, check_reward,
             check_multi_turn, check_agent, check_rollout_kind, check_distill, check_selfplay, check_expert_parallel, check_ulysses, check_pf_ppo,
             check_critic_pretrain, check_prime)
RL_MACHINE_CHECKS = (check_model, check_lora_targets, check_adapter_sync, check_engine_installed, check_loggers,
                     check_cuda, check_gpu_workers, check_cpu_split, check_distill_teachers, check_vision, check_rollout_images,
                     check_image_data, check_expert_model, check_ulysses_model, check_prime_model,
                     check_router_replay_model, check_environment_rows, check_agent_template,
                     check_chat_template)
SFT_CHECKS = (check_sft_keys, check_sft_batch, check_lora, check_sft_best_metric, check_distill, check_expert_parallel,
              check_ulysses)
SFT_MACHINE_CHECKS = (check_model, check_lora_targets, check_loggers, check_cuda, check_gpu_workers,
                      check_expert_model, check_ulysses_model, check_chat_template)


def validate(loaded: LoadedConfig, *, machine: bool = True, reach_services: bool = True
             ) -> tuple[list[Problem], BatchPlan | SFTPlan]:
    """All problems (errors and warnings) of a type-checked config, and its batch plan (with the
    machine pass, resources.gpus_per_node = "auto" is resolved here, and the plan says to what).

    `reach_services` (with `machine`): connect to the reward URLs. Training passes False: its
    reward sources connect when they start, and an unreachable one is an error there."""
    auto_problems, auto = [], ""
    if machine:
        loaded, auto, auto_problems = resolve_auto_problems(loaded)
    c = loaded.config
    ctx = CheckContext(base_dir=loaded.base_dir, raw=loaded.raw, machine=machine,
                       reach_services=machine and reach_services,
                       val_data_sources=_val_data_sources(c, loaded.base_dir, machine))
    if c.run.kind == "sft":
        problems, plan = _validate_sft(loaded, ctx, auto_problems, auto)
    else:
        problems, plan = _validate_rl(loaded, ctx, auto_problems, auto)
    # A key that failed its own check keeps its default: rules about it would mislead.
    bad_keys = {p.key for p in loaded.problems if p.severity == "error"}
    return list(loaded.problems) + [p for p in problems if p.key not in bad_keys], plan


def _validate_rl(loaded: LoadedConfig, ctx: CheckContext, auto_problems: list, auto: str):
    problems, c = check_registered(loaded.config, ctx)   # an unknown name is checked further at its default
    problems += auto_problems + check_sft_section_unused(c, ctx)
    batch_problems, plan = check_batches(c)
    plan = dataclasses.replace(plan, gpus_per_node_resolved=auto)
    problems += batch_problems
    for check in RL_CHECKS:
        problems += check(c, ctx)
    if ctx.machine:
        problems += check_reward_model(c, ctx)
        file_problems, plan = _files(c, ctx, plan, rl=True)
        problems += file_problems
        for check in RL_MACHINE_CHECKS:
            problems += check(c, ctx)
    return problems + check_best_metric(c, ctx), plan


def _validate_sft(loaded: LoadedConfig, ctx: CheckContext, auto_problems: list, auto: str):
    c, problems = loaded.config, list(auto_problems)
    for check in SFT_CHECKS:
        problems += check(c, ctx)
    plan = sft_plan(c, auto)
    if ctx.machine:
        file_problems, plan = _files(c, ctx, plan, rl=False)
        problems += file_problems
        for check in SFT_MACHINE_CHECKS:
            problems += check(c, ctx)
    return problems, plan


def _val_data_sources(c, base, machine: bool):
    """Read only when RL's run.best_metric may name a per-source metric (the machine pass)."""
    return val_data_sources(c, base) if machine and c.run.best_metric and c.run.kind != "sft" else None


def _files(c, ctx: CheckContext, plan, *, rl: bool):
    """The data files, then (RL) reward.function's file; only when all are there are the rows
    read into the plan. SFT ignores reward.function but, as before, skips the rows when it is bad."""
    data, reward = check_data_files(c, ctx), check_reward_function(c, ctx)
    problems = data + (reward if rl else [])
    if not data and not reward:
        rows_problems, plan = plan_with_rows(c, ctx, plan)
        problems += rows_problems
    return problems, plan
