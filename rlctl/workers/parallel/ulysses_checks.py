"""Config checks of actor/critic.ulysses_sequence_parallel_size (rlctl.workers.parallel.ulysses).

Config pass: the ranks split into sp groups, and what is not built with sequence parallelism yet
(float16) is refused in one line. Machine pass: the attention heads of the model, and of the
distillation teachers, split over the sp ranks, and their attention has no variant Ulysses
attention does not implement (sinks, ALiBi; read from their config.json and the family's modeling
code; a model not on disk is checked by the workers at start).
Checks keep the contract of rlctl.config.checks: `check(config, ctx) -> list[Problem]`.
"""

from __future__ import annotations

import dataclasses

from rlctl.config.checks import CheckContext
from rlctl.config.loader import Problem
from rlctl.config.plan import world_size
from rlctl.config.schema import SEPARATE_ROLLOUT_MODES, Config, distill_enabled, teacher_paths
from rlctl.models.checks import model_config
from rlctl.workers.parallel.ulysses import attention_variant_problem, head_problem

ACTOR_KEY = "actor.ulysses_sequence_parallel_size"
CRITIC_KEY = "critic.ulysses_sequence_parallel_size"


def _refused(what: str, key: str = ACTOR_KEY) -> str:
    return f"{what} is not supported with {key} > 1 yet; set {key} = 1"


def check_ulysses(c: Config, ctx: CheckContext) -> list[Problem]:
    problems = []
    workers = world_size(c.resources, c.rollout.mode in SEPARATE_ROLLOUT_MODES)
    for key, sp in ((ACTOR_KEY, c.actor.ulysses_sequence_parallel_size),
                    (CRITIC_KEY, c.critic.ulysses_sequence_parallel_size)):
        if sp > 1 and workers % sp:
            problems.append(Problem(key, f"{workers} training ranks do not split into sequence-parallel groups of "
                                         f"{sp}; use a divisor of {workers}, or a multiple of {sp} ranks "
                                         "(resources.workers, or GPUs)"))
    sp = max(c.actor.ulysses_sequence_parallel_size, c.critic.ulysses_sequence_parallel_size)
    key = ACTOR_KEY if c.actor.ulysses_sequence_parallel_size > 1 else CRITIC_KEY
    if sp == 1:
        return problems
    if c.model.dtype == "float16":
        problems.append(Problem("model.dtype", _refused("model.dtype = \"float16\" (bfloat16 is tested)", key)))
    return problems


def check_ulysses_model(c: Config, ctx: CheckContext) -> list[Problem]:
    """The heads of the model (actor), of each distillation teacher (its pass runs at the actor's
    sp size) and of the critic's model split over their sp sizes; no vision tower."""
    sp = c.actor.ulysses_sequence_parallel_size
    problems = _model_problems(c, ctx, ACTOR_KEY, sp)
    for name, path in (teacher_paths(c).items() if distill_enabled(c) and sp > 1 else ()):
        teacher = dataclasses.replace(c, model=dataclasses.replace(c.model, path=path))
        problems += [dataclasses.replace(p, message=f"teacher {name!r}: {p.message}")
                     for p in _model_problems(teacher, ctx, ACTOR_KEY, sp)]
    if c.critic.model_path:
        c = dataclasses.replace(c, model=dataclasses.replace(c.model, path=c.critic.model_path))
    return problems + _model_problems(c, ctx, CRITIC_KEY, c.critic.ulysses_sequence_parallel_size)


def _model_problems(c: Config, ctx: CheckContext, key: str, sp: int) -> list[Problem]:
    hf = model_config(c, ctx) if sp > 1 else None
    if hf is None:
        return []
    if hf.get("vision_config") is not None:
        return [Problem(key, _refused("a vision-language model", key))]
    text = hf.get("text_config") or hf
    heads = int(text.get("num_attention_heads") or 0)
    if not heads:
        return []
    problem = head_problem(heads, int(text.get("num_key_value_heads") or heads), sp)
    if problem:
        return [Problem(key, f"{problem}; use a size that divides the heads")]
    variant = attention_variant_problem(str(text.get("model_type") or hf.get("model_type") or ""), text)
    return [Problem(key, f"{variant}; set {key} = 1")] if variant else []
