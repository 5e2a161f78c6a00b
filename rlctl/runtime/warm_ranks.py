"""Warm ranks: rank processes kept between the runs of one Ray session (`RLCTL_WARM_RANKS=1`).

Starting a worker group costs seconds per rank before its first step: a Ray worker process,
`import torch`, then the transformers import behind the roles' `__init__` (about 9 s on two CPU
cores, most of a short run on a tiny model). Many short runs in one Ray session — a test suite, a
sweep from a notebook — pay it again for every run. With this switch on, a group that ends healthy
and idle is parked instead of killed: its ranks drop their roles, leave their process group and get
their environment back (`WorkerHost.reset`), and the next group of the same shape in the same Ray
session takes them, then joins a new process group and builds its roles as a fresh group would.

A rank is parked only when nothing of its run can outlive it: a rank that imported code from
outside the installed packages (a project's reward.py, a plugin — cached in `sys.modules` and in
registries) or an inference engine with process-wide state (vLLM, SGLang) ends as before. A parked
group keeps its placement group, so its CPUs and GPUs stay reserved. Groups of several shapes stay
parked side by side while the session has room: a group of a shape nobody parked frees the
longest-parked groups until its own CPUs and GPUs are free beside the rest (all of them on a cluster
of several nodes, whose per-node room the session's totals do not tell), and a group whose resources
do not come (the session's view of its free resources lags, or another run took them) frees the rest
while it waits (rlctl.runtime.worker_group). Any group started with the switch off frees every
parked group before it reserves its own. Ending the Ray session drops them all.
Off by default: a run of `rlctl train` is one Ray session with one run, where nothing is reused.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

ENV = "RLCTL_WARM_RANKS"
RESET_TIMEOUT_S = 10.0   # a reset takes well under a second; a Ray that stopped answering must not stall


@dataclass
class Parked:
    key: tuple
    placement_group: object
    actors: list
    cpus: float   # what its placement group holds
    gpus: float


_PARKED: list[Parked] = []


def enabled() -> bool:
    return os.environ.get(ENV) == "1"


def shape_key(pool, env: dict[str, str]) -> tuple:
    """What a rank process is fixed to at start: its Ray session, rank layout, resources and environment."""
    import ray

    return (ray.get_runtime_context().get_job_id(), pool.nodes, pool.world_size, pool.ranks_per_node,
            pool.cpus_per_worker, pool.use_gpu, tuple(sorted(env.items())))


def take(pool, env: dict[str, str]) -> list | None:
    """The actors of a parked group of this shape, with its placement group now `pool`'s; None when
    there is none or the switch is off (ranks parked while it was on may remain), after freeing every
    parked group so that the new group's resources are free."""
    if not _PARKED:
        return None
    if not enabled():
        drop()
        return None
    key = shape_key(pool, env)
    for i, parked in enumerate(_PARKED):
        if parked.key == key:
            if _answer(parked.actors):
                del _PARKED[i]
                pool.placement_group = parked.placement_group
                return parked.actors
            drop()   # a rank died while parked (OOM killer, a signal): drop them all and start anew
            return None
    make_room(pool)
    return None


def _needs(pool) -> tuple[float, float]:
    bundles = pool.bundles()
    return sum(b.get("CPU", 0.0) for b in bundles), sum(b.get("GPU", 0.0) for b in bundles)


def make_room(pool) -> None:
    """Free parked groups, the longest parked first, until the session's free CPUs and GPUs hold
    `pool`'s group; on several nodes free them all (the totals do not say which node has room)."""
    import ray

    if pool.nodes > 1:
        drop()
        return
    free = ray.available_resources()
    cpus, gpus = free.get("CPU", 0.0), free.get("GPU", 0.0)
    need_cpus, need_gpus = _needs(pool)
    while _PARKED and (cpus < need_cpus or gpus < need_gpus):
        parked = _PARKED.pop(0)
        _free(parked)
        cpus, gpus = cpus + parked.cpus, gpus + parked.gpus


def _answer(actors: list) -> bool:
    import ray

    try:
        ray.get([actor.node_info.remote() for actor in actors], timeout=RESET_TIMEOUT_S)
        return True
    except Exception:  # a dead rank, or no answer in time
        return False


def park(pool, env: dict[str, str], actors: list) -> bool:
    """Reset the ranks of a healthy, idle group and keep them with its placement group. False, with
    nothing kept, when a rank is gone, does not answer in time or ran code it cannot forget."""
    import ray

    try:
        clean = ray.get([actor.reset.remote() for actor in actors], timeout=RESET_TIMEOUT_S)
    except Exception:  # a dead rank, a timeout, Ray gone: the caller kills the group
        return False
    if not all(clean):
        return False
    _PARKED.append(Parked(shape_key(pool, env), pool.placement_group, actors, *_needs(pool)))
    pool.placement_group = None   # owned by the parked entry now
    return True


def drop() -> None:
    """Kill every parked rank and free its placement group (a new shape needs the resources)."""
    while _PARKED:
        _free(_PARKED.pop())


def _free(parked: Parked) -> None:
    from rlctl.runtime.host import kill_hosts
    from rlctl.runtime.resource_pool import free_placement_group

    kill_hosts(parked.actors)
    free_placement_group(parked.placement_group)


def forget() -> None:
    """The Ray session is ending: its shutdown ends the parked ranks, only the handles are left to drop."""
    _PARKED.clear()
