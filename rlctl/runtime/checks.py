"""The machine pass of the resources: GPUs requested are visible, the CPU split of embedded Ray
fits this machine's cores, and resources.gpus_per_node = "auto" resolved to a number.

Checks keep the contract of rlctl.config.checks: `check(config, ctx) -> list[Problem]`.
"""

from __future__ import annotations

import dataclasses

from rlctl.config.checks import CheckContext
from rlctl.config.loader import LoadedConfig, Problem
from rlctl.config.schema import SEPARATE_ROLLOUT_MODES, Config


def check_cuda(c: Config, ctx: CheckContext) -> list[Problem]:
    if c.resources.gpus_per_node and not c.resources.address and not _cuda_available():
        return [Problem("resources.gpus_per_node", f"{c.resources.gpus_per_node} GPU(s) requested but no "
                                                   "CUDA GPU is visible; set resources.gpus_per_node = 0 for CPU")]
    return []


def check_gpu_workers(c: Config, ctx: CheckContext) -> list[Problem]:
    """On GPUs every GPU is one rank: a CPU recipe's resources.workers = 2 on one GPU is caught here,
    not when the worker group starts."""
    from rlctl.runtime.resource_pool import GPU_WORKERS_HINT, gpu_workers_mismatch

    gpus = c.resources.gpus_per_node
    if not isinstance(gpus, int) or gpus <= 0 or c.rollout.mode in SEPARATE_ROLLOUT_MODES:
        return []   # a separate rollout group: rlctl.workers.rollout.checks counts the actor's GPUs
    mismatch = gpu_workers_mismatch(c.resources.workers, c.resources.nodes * gpus)
    return [Problem("resources.workers", f"{mismatch}; {GPU_WORKERS_HINT}")] if mismatch else []


def check_cpu_split(c: Config, ctx: CheckContext) -> list[Problem]:
    """Embedded Ray on CPU: the groups' ranks x cpus_per_worker must fit this machine's cores."""
    res = c.resources
    if res.address or res.gpus_per_node not in (0, "auto") or c.rollout.mode not in SEPARATE_ROLLOUT_MODES:
        return []
    from rlctl.runtime.ray_env import machine_cpus

    need, have = (res.workers + res.rollout_workers) * res.cpus_per_worker, machine_cpus()
    if need <= have:
        return []
    return [Problem("resources.rollout_workers", f"the actor ({res.workers}) and rollout ({res.rollout_workers}) "
                    f"workers x cpus_per_worker = {res.cpus_per_worker} need {need} CPUs, this machine has {have}: "
                    "lower resources.workers, rollout_workers or cpus_per_worker")]


def resolve_auto(loaded: LoadedConfig, address: str = "") -> tuple[LoadedConfig, str]:
    """resources.gpus_per_node = "auto" -> the GPUs this machine sees (0 on CPU), once at start-up,
    so the run's config.resolved.toml records what was used and resume keeps it. Returns the
    config and why "auto" became that number ("" when the value was a number)."""
    from rlctl.runtime.resource_pool import resolve_gpus_per_node

    c = loaded.config
    if c.resources.gpus_per_node != "auto":
        return loaded, ""
    n, why = resolve_gpus_per_node("auto", address or c.resources.address)
    resources = dataclasses.replace(c.resources, gpus_per_node=n)
    return dataclasses.replace(loaded, config=dataclasses.replace(c, resources=resources)), why


def resolve_auto_problems(loaded: LoadedConfig) -> tuple[LoadedConfig, str, list[Problem]]:
    """resolve_auto for validation: a failure is a problem on resources.gpus_per_node, not a raise."""
    from rlctl.errors import ConfigError

    try:
        loaded, why = resolve_auto(loaded)
    except ConfigError as e:
        return loaded, "", [Problem("resources.gpus_per_node",
                                    f"{e.message.removeprefix('resources.gpus_per_node = ')}; {e.hint}")]
    return loaded, why, []


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()
