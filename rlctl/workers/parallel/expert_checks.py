"""Config checks of actor.expert_parallel_size, actor.router_replay and actor.moe_aux_loss_coef (rlctl.workers.parallel.expert_parallel).

What expert parallelism does not cover yet is refused here, before anything starts, rather than
run with experts silently whole or wrong. Checks keep the contract of rlctl.config.checks:
`check(config, ctx) -> list[Problem]`.
"""

from __future__ import annotations

from rlctl.config.checks import CheckContext
from rlctl.config.loader import Problem
from rlctl.config.plan import world_size
from rlctl.config.schema import SEPARATE_ROLLOUT_MODES, Config

KEY = "actor.expert_parallel_size"


def check_expert_parallel(c: Config, ctx: CheckContext) -> list[Problem]:
    problems = []
    if c.actor.router_replay:
        problems += _replay_problems(c)
    coef = c.actor.moe_aux_loss_coef
    if coef < 0 and coef != -1:
        problems.append(Problem("actor.moe_aux_loss_coef", f"{coef}: use -1 (the model's router_aux_loss_coef), 0 "
                                                           "(off) or a positive weight"))
    ep = c.actor.expert_parallel_size
    if ep == 1:
        return problems
    ranks = world_size(c.resources, c.rollout.mode in SEPARATE_ROLLOUT_MODES)   # GPUs: nodes x GPUs (- rollout's)
    if ranks % ep:
        problems.append(Problem(KEY, f"{ep} does not divide the actor's {ranks} training ranks (resources.workers, "
                                     "or GPUs): each expert group is ep of the actor's ranks; pick a divisor of "
                                     f"{ranks}"))
    refusals = (
        (c.rollout.engine not in ("hf", "vllm"), "rollout.engine", f"\"{c.rollout.engine}\" with {KEY} > 1 is not "
                                                                   "supported yet (the hf and vllm engines get the "
                                                                   f"gathered experts); use \"hf\" or \"vllm\", or "
                                                                   f"{KEY} = 1"),
        (c.model.lora.rank > 0, "model.lora.rank", f"LoRA with {KEY} > 1 is not supported yet; use full "
                                                   f"fine-tuning, or {KEY} = 1"),
        # untested: each layer's two sp all-to-alls around two ep ones, and both gradient scalings stacked
        (c.actor.ulysses_sequence_parallel_size > 1, "actor.ulysses_sequence_parallel_size",
         f"sequence parallelism together with {KEY} > 1 is not supported yet; set one of them to 1"),
    )
    problems += [Problem(key, message) for refused, key, message in refusals if refused]
    if c.rollout.engine == "vllm" and c.run.kind != "sft":   # the engine-side layout, stated (docs/rollout.md)
        problems.append(Problem("rollout.engine", f"\"vllm\" with {KEY} = {ep}: each rank's engine holds every "
                                                  "expert (vLLM's own expert parallelism is off; each push gathers "
                                                  "the split ones), beside the trainer's share: leave it memory for "
                                                  "the whole model (rollout.gpu_memory_utilization)",
                                severity="warning"))
    return problems


def check_expert_model(c: Config, ctx: CheckContext) -> list[Problem]:
    """Machine pass: model.path is a mixture-of-experts model whose expert count ep divides (read from
    its config.json; a hub model not yet downloaded is checked when the workers load it); an MoE
    policy's load-balancing loss is not asked for with sequence parallelism."""
    ep, sp = c.actor.expert_parallel_size, c.actor.ulysses_sequence_parallel_size
    if ep == 1 and (sp == 1 or c.actor.moe_aux_loss_coef == 0):
        return []
    from rlctl.workers.parallel.expert_parallel import experts_per_layer

    config = _model_config(c, ctx)
    if config is None:
        return []
    from rlctl.workers.parallel import moe_aux

    if why := moe_aux.sp_refusal(moe_aux.configured_coef(config, c.actor.moe_aux_loss_coef), sp):
        return [Problem(moe_aux.KEY, why)]
    if ep == 1:
        return []
    experts = experts_per_layer(config)
    if experts == 0:
        return [Problem(KEY, f"{ep} but {c.model.path} ({config.model_type}) has no experts: expert parallelism is "
                             "for mixture-of-experts models; set it to 1")]
    if experts % ep:
        return [Problem(KEY, f"{ep} does not divide the model's {experts} experts per layer; pick a divisor")]
    from rlctl.workers.parallel.expert_parallel import family_problem

    why = family_problem(getattr(config.get_text_config(), "model_type", config.model_type))
    return [Problem(KEY, f"{ep}: {why}")] if why else []


def _model_config(c: Config, ctx: CheckContext):
    """model.path's transformers config, or None where it cannot be read here (check_model reports
    a broken one; a hub model not yet downloaded is checked when the workers load it)."""
    from rlctl.errors import DataError
    from rlctl.models.hub import resolve_model

    try:
        folder = resolve_model(c.model.path, ctx.base_dir).folder
    except DataError:
        return None   # reported by check_model
    if folder is None or not (folder / "config.json").is_file():
        return None
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(folder), trust_remote_code=c.model.trust_remote_code)
    except (OSError, ValueError):
        return None   # reported by check_model


REPLAY = "actor.router_replay"


def _replay_problems(c: Config) -> list[Problem]:
    """What router replay cannot serve: it replays the routes of RL's old-log-prob pass."""
    refusals = (
        (c.run.kind == "sft", "run.kind", f"SFT has no log-prob pass whose routes {REPLAY} could replay; set "
                                          f"{REPLAY} = false"),
        (c.actor.ulysses_sequence_parallel_size > 1, "actor.ulysses_sequence_parallel_size",
         f"{REPLAY} with sequence parallelism is not supported yet (each rank routes a slice of the tokens); "
         f"set it to 1, or {REPLAY} = false"),
        (c.algorithm.rollout_correction.bypass_mode, "algorithm.rollout_correction.bypass_mode",
         f"takes old_log_prob from the rollout engine, so no log-prob pass records the routes {REPLAY} replays; "
         f"set one of them to false"),
    )
    return [Problem(key, message) for refused, key, message in refusals if refused]


def check_router_replay_model(c: Config, ctx: CheckContext) -> list[Problem]:
    """Machine pass: router replay needs a mixture-of-experts model with a router it knows."""
    if not c.actor.router_replay:
        return []
    config = _model_config(c, ctx)
    if config is None:
        return []
    from rlctl.workers.parallel.expert_parallel import experts_per_layer
    from rlctl.workers.parallel.router_replay import REPLAYABLE

    if experts_per_layer(config) == 0:
        return [Problem(REPLAY, f"true but {c.model.path} ({config.model_type}) has no experts: router replay is for "
                                "mixture-of-experts models; set it to false")]
    if config.model_type not in REPLAYABLE:
        return [Problem(REPLAY, f"true but {config.model_type}'s router is not one router replay knows (it serves "
                                f"{', '.join(REPLAYABLE)}); set it to false")]
    return []
