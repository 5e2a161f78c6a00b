"""Starting a run's workers from its config and the role table (rlctl.workers.roles.table): the actor
group, and every other role the run has, in the actor's processes or in a pool of its own.

    workers = start_workers(cfg, total_steps=N, needs=run_needs(cfg))   # rlctl.algorithms, once per run
    workers.actor.generate(batch, seed=..., mode="train")     # RoleHandle calls
    workers.critic.compute_values(batch)                      # None when no critic is needed
    workers.trained()                                         # the roles a checkpoint holds, by folder

Call inside `ray_session()`; its exit kills the groups on any way out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlctl.runtime.resource_pool import ResourcePool
from rlctl.runtime.worker_group import RoleHandle, WorkerGroup
from rlctl.workers.roles import table
from rlctl.workers.roles.table import ACTOR, BESIDE_ACTOR, TEACHER_ROLE, RunRoles


@dataclass
class Workers:
    """The started roles by name (a teacher's as "teacher:NAME") and the groups that hold them."""

    roles: dict[str, RoleHandle]
    groups: list[WorkerGroup] = field(default_factory=list)
    trained_names: tuple[str, ...] = ()   # the roles whose rows are trained, in table order

    @property
    def actor(self) -> RoleHandle:
        return self.roles["actor"]

    @property
    def critic(self) -> RoleHandle | None:
        return self.roles.get("critic")

    @property
    def prm(self) -> RoleHandle | None:   # PRIME's implicit PRM
        return self.roles.get("prm")

    @property
    def reward_model(self) -> RoleHandle | None:   # reward.model's workers
        return self.roles.get("reward_model")

    @property
    def rollout(self) -> RoleHandle | None:   # rollout.mode = "one_step_off" / "async": the separate rollout group
        return self.roles.get("rollout")

    @property
    def teachers(self) -> dict[str, RoleHandle]:
        """distill: each teacher's name -> its workers."""
        return {name.removeprefix(TEACHER_ROLE): handle for name, handle in self.roles.items()
                if name.startswith(TEACHER_ROLE)}

    def trained(self) -> dict[str, RoleHandle]:
        """The trained roles the run started: each saves into <step>/<name>/ of a checkpoint."""
        return {name: self.roles[name] for name in self.trained_names}

    def shutdown(self) -> None:
        for group in self.groups:
            group.shutdown()


def start_workers(config, *, total_steps: int, needs) -> Workers:
    """Every role of the table the run has (`needs`: rlctl.algorithms.run_needs): the ACTOR and,
    when resources.colocate, the BESIDE_ACTOR roles in the actor group's ranks (one process per rank
    holds all their models); the other roles each in a pool of its own, named after its row."""
    run = RunRoles(config, total_steps, needs)
    beside, apart, trained = {}, [], []
    for role in table.ROLES:   # read at each start: a row added after import (a test's) counts
        specs = {name: (role.worker_class(), kwargs) for name, kwargs in role.instances(run).items()}
        if not specs:
            continue
        if role.trained and list(specs) != [role.name]:   # its checkpoint folder is <step>/<name>/
            raise ValueError(f"trained role {role.name!r} must have one instance named {role.name!r}, not {list(specs)}")
        trained += list(specs) if role.trained else []
        if role.placement == ACTOR or (role.placement == BESIDE_ACTOR and config.resources.colocate):
            beside.update(specs)
        else:
            apart.append((role, specs))
    actor_row = next(role for role in table.ROLES if role.placement == ACTOR)
    groups = [WorkerGroup(ResourcePool(actor_row.resources(config), name="actor"), beside, name="actor")]
    try:
        for role, specs in apart:
            groups.append(WorkerGroup(ResourcePool(role.resources(config), name=role.name), specs, name=role.name))
    except BaseException:
        groups[0].shutdown()
        raise
    return Workers(roles={name: group.role(name) for group in groups for name in group.role_classes},
                   groups=groups, trained_names=tuple(trained))


def start_shared_base(runs: list[RunRoles]) -> tuple[WorkerGroup, list[Workers]]:
    """Several LoRA runs on one base (rlctl.controller.group): one actor group whose every rank holds
    one actor role per run, "actor@<k>", all on the one copy of the base that rank loaded
    (ActorRolloutRefWorker's shared_base). Each run sees its own role as its "actor" and nothing
    else (rlctl.controller.group refuses runs with other roles); the group is the caller's to shut down."""
    row = next(role for role in table.ROLES if role.placement == ACTOR)
    specs = {f"actor@{k}": (row.worker_class(), {**row.instances(run)["actor"], "shared_base": True})
             for k, run in enumerate(runs)}
    group = WorkerGroup(ResourcePool(row.resources(runs[0].config), name="actor"), specs, name="actor")
    return group, [Workers(roles={"actor": group.role(name)}, trained_names=("actor",)) for name in specs]
