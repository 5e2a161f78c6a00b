"""Config checks of actor.expert_parallel_size, actor.router_replay and actor.moe_aux_loss_coef (rlctl.workers.expert_parallel).

What expert parallelism does not cover yet is refused here, before anything starts, rather than
run with experts silently whole or wrong. Checks keep the contract of rlctl.config.checks:
`check(config, ctx) -> list[Problem]`.
"""

from __future__ import annotations

from rlctl.config.checks import CheckContext
from rlctl.config.loader import Problem
from rlctl.config.schema import Config

KEY = "actor.expert_parallel_size"


def check_expert_parallel(c: Config, ctx: CheckContext) -> list[Problem]:
    problems = []
    if c.actor.router_replay:
        problems.append(Problem("actor.router_replay", "is not implemented yet: the update recomputes its own "
                                                       "routes; set it to false"))
    coef = c.actor.moe_aux_loss_coef
    if coef < 0 and coef != -1:
        problems.append(Problem("actor.moe_aux_loss_coef", f"{coef}: use -1 (the model's router_aux_loss_coef), 0 "
                                                           "(off) or a positive weight"))
    ep = c.actor.expert_parallel_size
    if ep == 1:
        return problems
    if c.resources.workers % ep:
        problems.append(Problem(KEY, f"{ep} does not divide resources.workers = {c.resources.workers}: each "
                                     "expert group is ep of the actor's ranks; pick a divisor of the workers"))
    refusals = (
        (c.rollout.engine not in ("hf", "vllm"), "rollout.engine", f"\"{c.rollout.engine}\" with {KEY} > 1 is not "
                                                                   "supported yet (the hf and vllm engines get the "
                                                                   f"gathered experts); use \"hf\" or \"vllm\", or "
                                                                   f"{KEY} = 1"),
        (c.model.lora.rank > 0, "model.lora.rank", f"LoRA with {KEY} > 1 is not supported yet; use full "
                                                   f"fine-tuning, or {KEY} = 1"),
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
    from rlctl.errors import DataError
    from rlctl.models.hub import resolve_model
    from rlctl.workers.expert_parallel import experts_per_layer

    try:
        folder = resolve_model(c.model.path, ctx.base_dir).folder
    except DataError:
        return []   # reported by check_model
    if folder is None or not (folder / "config.json").is_file():
        return []
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(folder), trust_remote_code=c.model.trust_remote_code)
    except (OSError, ValueError):
        return []   # reported by check_model
    from rlctl.workers import moe_aux

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
    return []
