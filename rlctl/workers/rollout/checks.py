"""Config checks of the rollout engine, from what its registry entry declares
(rlctl.workers.rollout.registry): tensor-parallel size, temperature, GPUs and the pip extra, and
what the separate rollout group of rollout.mode = "one_step_off" / "async" supports so far.

Checks keep the contract of rlctl.config.checks: `check(config, ctx) -> list[Problem]`.
"""

from __future__ import annotations

import importlib.util

from rlctl.config.checks import CheckContext
from rlctl.config.loader import Problem
from rlctl.config.schema import SEPARATE_ROLLOUT_MODES, Config
from rlctl.models.checks import model_config
from rlctl.rollouts.table import kind_of
from rlctl.workers.rollout.registry import rollout_engine_info, sharding_engines
from rlctl.workers.rollout.vllm_platform import cpu_refusal

ASYNC_KEYS = ("max_staleness", "staleness_strategy", "sync_every", "partial_rollout", "partial_chunk")


def check_rollout_engine(c: Config, ctx: CheckContext) -> list[Problem]:
    """The engine's declared limits: tensor-parallel size, temperature."""
    engine = rollout_engine_info(c.rollout.engine)
    tp, most, gpus = c.rollout.tensor_parallel_size, engine.max_tensor_parallel_size, c.resources.gpus_per_node
    gpus = gpus if isinstance(gpus, int) else 0   # "auto" before it is resolved (--skip-machine)
    problems = []
    if most is not None and tp > most:
        others = " or ".join(f'"{n}"' for n in sharding_engines())
        problems.append(Problem("rollout.tensor_parallel_size", f"{tp}: the {engine.name} training rollout runs one "
                                f"engine per GPU rank (tensor-parallel {most}); set it to {most}, or use "
                                f"rollout.engine = {others}"))
    elif tp != 1 and gpus and gpus % tp:
        problems.append(Problem("rollout.tensor_parallel_size", f"{tp}: a {engine.title} engine spans {tp} GPUs of one "
                                f"node, but resources.gpus_per_node = {gpus} is not a multiple of it"))
    if engine.max_temperature is not None and c.rollout.temperature > engine.max_temperature:
        problems.append(Problem("rollout.temperature", f"{c.rollout.temperature:g}: {engine.title} samples with "
                                                       f"temperature <= {engine.max_temperature:g}"))
    return problems


def check_one_step_off(c: Config, ctx: CheckContext) -> list[Problem]:
    """rollout.mode = "one_step_off" or "async": what the separate rollout group supports so far."""
    mode = c.rollout.mode
    if mode not in SEPARATE_ROLLOUT_MODES:
        if "rollout_workers" in ctx.raw.get("resources", {}):
            return [Problem("resources.rollout_workers", "is used only with rollout.mode = \"one_step_off\" or "
                                                         "\"async\" and is ignored", severity="warning")]
        return _async_problems(c, ctx)
    problems = []
    gpus = c.resources.gpus_per_node
    if rollout_engine_info(c.rollout.engine).gpu_only:   # its rollout worker is not built (hf and vllm are)
        problems.append(Problem("rollout.mode", f"\"{mode}\": rollout.engine = {c.rollout.engine!r} in the separate "
                                "rollout group is not built yet: use rollout.engine = \"hf\" or \"vllm\", or "
                                "rollout.mode = \"sync\""))
    if isinstance(gpus, int) and gpus > 0:
        problems += _gpu_split_problems(c, mode, gpus)
    if c.algorithm.dynamic_sampling.enable and mode == "one_step_off":
        problems.append(Problem("algorithm.dynamic_sampling.enable", "dynamic sampling decides how many batches to "
                                "generate from their rewards, which one_step_off generates a step ahead: turn one "
                                "of them off, or use rollout.mode = \"async\" (it filters groups as they arrive)"))
    if c.data.batch_size < c.resources.rollout_workers:
        problems.append(Problem("resources.rollout_workers", f"{c.resources.rollout_workers} rollout workers for "
                                f"data.batch_size = {c.data.batch_size} prompts: every worker needs a prompt; use at "
                                "most data.batch_size"))
    return problems + _async_problems(c, ctx)


def _gpu_split_problems(c: Config, mode: str, gpus: int) -> list[Problem]:
    """On GPUs the rollout group takes resources.rollout_workers GPUs of the one node, one a rank,
    and the actor the other gpus_per_node - rollout_workers (rlctl.workers.roles.table.pool_resources)."""
    res = c.resources
    if res.nodes > 1:
        return [Problem("resources.nodes", f"{res.nodes}: \"{mode}\" on GPUs splits one node's GPUs between the "
                                           "actor and the rollout group; several nodes are not built yet: set "
                                           "resources.nodes = 1")]
    actor = gpus - res.rollout_workers
    if actor < 1:
        return [Problem("resources.rollout_workers", f"{res.rollout_workers} rollout GPUs + at least 1 actor GPU > "
                                                     f"resources.gpus_per_node = {gpus}: \"{mode}\" gives each "
                                                     "rollout rank a GPU and the actor the rest; use at most "
                                                     f"{gpus - 1} rollout workers")]
    if c.rollout.tensor_parallel_size > 1:
        return [Problem("rollout.tensor_parallel_size", f"{c.rollout.tensor_parallel_size}: \"{mode}\" on GPUs gives "
                                                        "each rollout rank one GPU; an engine over several is not "
                                                        "built yet: set it to 1")]
    if res.workers not in (1, actor):
        return [Problem("resources.workers", f"{res.workers}: with \"{mode}\" on GPUs the actor group is the "
                                             f"{actor} GPUs left beside the {res.rollout_workers} rollout GPUs "
                                             "(gpus_per_node - rollout_workers); leave resources.workers at 1")]
    return []


def _async_problems(c: Config, ctx: CheckContext) -> list[Problem]:
    """rollout.mode = "async": a schedule that can always make progress, and what is not built yet.
    The async keys set in another mode are ignored: a warning."""
    ro = c.rollout
    if ro.mode != "async":
        set_keys = [k for k in ASYNC_KEYS if k in ctx.raw.get("rollout", {})]
        return [Problem(f"rollout.{k}", "is used only with rollout.mode = \"async\" and is ignored",
                        severity="warning") for k in set_keys]
    problems = []
    if ro.sync_every > ro.max_staleness + 1:
        problems.append(Problem("rollout.sync_every", f"{ro.sync_every} with rollout.max_staleness = "
                                f"{ro.max_staleness}: a batch generated just before a push would be "
                                f"{ro.sync_every - 1} updates stale, so no batch could ever be trained; use "
                                f"sync_every <= max_staleness + 1 = {ro.max_staleness + 1}"))
    if ro.partial_rollout:
        problems += _partial_problems(c)
    return problems


def _partial_problems(c: Config) -> list[Problem]:
    """rollout.partial_rollout: what generation in rounds supports so far."""
    ro, problems = c.rollout, []
    if ro.partial_chunk >= c.data.max_response_length and kind_of(c).round_of == "tokens":   # else a round is a turn
        problems.append(Problem("rollout.partial_chunk", f"{ro.partial_chunk} >= data.max_response_length = "
                                f"{c.data.max_response_length}: every sample finishes in its first round, so none "
                                "is ever continued on newer weights; lower it to make partial rollouts matter",
                                severity="warning"))
    return problems


def check_engine_installed(c: Config, ctx: CheckContext) -> list[Problem]:
    """The machine pass: a GPU-only engine has GPUs, an engine's pip extra is installed (the CPU
    build's extra on a CPU run), and vLLM's CPU attention can run the model's head size."""
    engine = rollout_engine_info(c.rollout.engine)
    cpu = c.resources.gpus_per_node == 0
    if engine.gpu_only and cpu:
        return [Problem("rollout.engine", f"{engine.name!r} runs on GPUs only; set resources.gpus_per_node "
                                          "or use engine = \"hf\" on CPU")]
    if engine.extra and importlib.util.find_spec(engine.extra) is None:
        extra = engine.cpu_extra if cpu and engine.cpu_extra else engine.extra
        return [Problem("rollout.engine", f"{engine.name!r} is not installed; pip install \"rlctl[{extra}]\" "
                                          "(or use engine = \"hf\")")]
    if cpu and engine.cpu_extra:
        hf = model_config(c, ctx)
        why = cpu_refusal(hf) if hf is not None else None
        if why:
            return [Problem("rollout.engine", f"{engine.name!r} on CPU: {why}")]
    return []
