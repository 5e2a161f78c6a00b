"""The role table: every worker role a training run may start, where it runs, and which folder of
a checkpoint it owns. Start-up (rlctl.workers.roles.groups.start_workers), checkpointing and resume
(rlctl.controller.checkpointing) read this table and nothing else about the roles.

    for role in ROLES:
        role.instances(RunRoles(config, total_steps, needs))   # {} when the run has none of it

A new role is its worker class plus one row here. A trained role (`trained=True`) keeps a
TrainEngine and lists the engine's save/load/FLOPs methods once (rlctl.workers.compute.engine.trained_role_methods);
its state is saved under <step>/<name>/ of each checkpoint and loaded from there on resume.

Where a role runs (`placement`):
    ACTOR         the actor group's processes (the policy: actor, rollout and reference in one)
    BESIDE_ACTOR  in the actor group's processes when resources.colocate (one process per rank holds
                  both models), else in a pool of its own named after the row
    OWN_POOL      always a pool of its own, of the row's `resources(config)`

This module imports no torch or Ray: checkpointing reads the folder names without starting anything.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from rlctl.config.schema import SEPARATE_ROLLOUT_MODES, teacher_paths

if TYPE_CHECKING:
    from rlctl.algorithms.registry import Needs
    from rlctl.config.schema import Config, ResourcesConfig

ACTOR, BESIDE_ACTOR, OWN_POOL = "actor", "beside_actor", "own_pool"
TEACHER_ROLE = "teacher:"   # a teacher's role name is this prefix + its name in [distill.teachers]


@dataclass(frozen=True)
class RunRoles:
    """What decides which roles a run starts, and with which arguments."""

    config: Config
    total_steps: int   # training steps of the run (a trained role's LR schedule)
    needs: Needs       # the run's, computed once (rlctl.algorithms.run_needs)


@dataclass(frozen=True)
class Role:
    """One row of the table."""

    name: str        # the row; a trained role's checkpoint folder <step>/<name>/ (a trained role has one
                     # instance, of this name); a pool of its own's group name
    worker: str      # "module:Class", imported when a run starts the role
    placement: str   # ACTOR | BESIDE_ACTOR | OWN_POOL
    trained: bool    # its state is saved in each checkpoint and restored on resume
    # the run's instances of the role: {role name in its group: the worker class's keyword arguments}
    instances: Callable[[RunRoles], dict[str, dict[str, Any]]]
    resources: Callable[[Config], ResourcesConfig | None] = lambda config: config.resources   # its pool's [resources]

    def worker_class(self) -> type:
        import importlib

        module, _, name = self.worker.partition(":")
        return getattr(importlib.import_module(module), name)


def _actor(run: RunRoles) -> dict:
    return {"actor": {"config": run.config, "total_steps": run.total_steps, "needs": run.needs}}


def _when(need: str, name: str) -> Callable[[RunRoles], dict]:
    """A trained role the algorithm asks for by its `needs.<need>` declaration."""
    def instances(run: RunRoles) -> dict:
        return {name: {"config": run.config, "total_steps": run.total_steps}} if getattr(run.needs, need) else {}

    return instances


def _reward_model(run: RunRoles) -> dict:
    return {"reward_model": {"config": run.config}} if run.config.reward.model else {}


def teacher_instances(run: RunRoles) -> dict:
    """One role per teacher of distill.teacher / [distill.teachers] (a single teacher is named
    "teacher"); none for a teacher_url (the controller calls it) or without distillation."""
    paths = teacher_paths(run.config)
    return {TEACHER_ROLE + name: {"config": run.config, "path": path} for name, path in paths.items()}


def _rollout(run: RunRoles) -> dict:
    return {"rollout": {"config": run.config}} if run.config.rollout.mode in SEPARATE_ROLLOUT_MODES else {}


def pool_resources(config):
    """The [resources] the actor's pool and the separate rollout group's pool are made of (None
    for the rollout: no separate group). On CPU the rollout group is resources.rollout_workers
    ranks of cpus_per_worker CPUs beside the actor's resources.workers. On GPUs (one node) it is
    resources.rollout_workers ranks of one GPU each, and the actor group gets the node's other
    gpus_per_node - rollout_workers GPUs (rlctl.workers.rollout.checks.check_one_step_off checks
    the counts)."""
    from rlctl.runtime.resource_pool import resolve_gpus_per_node

    res = config.resources
    if config.rollout.mode not in SEPARATE_ROLLOUT_MODES:
        return res, None
    gpus, _ = resolve_gpus_per_node(res.gpus_per_node, res.address)
    if gpus == 0:
        return res, dataclasses.replace(res, workers=res.rollout_workers)
    if res.nodes != 1 or res.rollout_workers >= gpus:
        from rlctl.errors import ConfigError

        raise ConfigError(f"the rollout group's {res.rollout_workers} GPU(s) and the actor's need one node with more "
                          f"than {res.rollout_workers} GPUs, not {res.nodes} node(s) x {gpus}",
                          hint="set resources.nodes = 1 and resources.rollout_workers < gpus_per_node")
    actor = dataclasses.replace(res, gpus_per_node=gpus - res.rollout_workers)
    return actor, dataclasses.replace(res, gpus_per_node=res.rollout_workers, workers=res.rollout_workers)


# In start order; the actor's row is first (its group is the one the others join).
ROLES: tuple[Role, ...] = (
    Role("actor", "rlctl.workers.roles.actor:ActorRolloutRefWorker", ACTOR, trained=True, instances=_actor,
         resources=lambda config: pool_resources(config)[0]),
    Role("critic", "rlctl.workers.roles.critic:CriticWorker", BESIDE_ACTOR, trained=True,
         instances=_when("critic", "critic")),
    Role("prm", "rlctl.workers.roles.prime_rm:ImplicitPRMWorker", BESIDE_ACTOR, trained=True,   # PRIME's implicit PRM
         instances=_when("implicit_prm", "prm")),
    Role("reward_model", "rlctl.workers.roles.reward_model:RewardModelWorker", BESIDE_ACTOR, trained=False,
         instances=_reward_model),
    Role("teacher", "rlctl.workers.roles.teacher:TeacherWorker", BESIDE_ACTOR, trained=False, instances=teacher_instances),
    Role("rollout", "rlctl.workers.roles.rollout_worker:RolloutWorker", OWN_POOL, trained=False, instances=_rollout,
         resources=lambda config: pool_resources(config)[1]),
)


def role_folders() -> tuple[str, ...]:
    """The checkpoint folders the trained roles own ("actor/", "critic/", "prm/"): the ranks that
    load them check their contents (rlctl.workers.compute.checkpoint_io.verify_share)."""
    return tuple(f"{role.name}/" for role in ROLES if role.trained)


def trained_role_names() -> set[str]:
    return {role.name for role in ROLES if role.trained}
