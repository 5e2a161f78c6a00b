"""Starting a run's workers from its config: the actor group, and the critic, PRIME's implicit PRM,
the reward model (reward.model) and the distillation teachers co-located with it or apart.

    workers = start_workers(cfg, total_steps=N, needs_reference=needs.reference,
                            needs_critic=needs.critic)
    workers.actor.generate(batch, seed=..., mode="train")     # RoleHandle calls
    workers.critic.compute_values(batch)                      # None when no critic is needed

Call inside `ray_session()`; its exit kills the groups on any way out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlctl.config.schema import SEPARATE_ROLLOUT_MODES
from rlctl.runtime.resource_pool import ResourcePool
from rlctl.runtime.worker_group import RoleHandle, WorkerGroup


@dataclass
class Workers:
    actor: RoleHandle
    critic: RoleHandle | None
    groups: list[WorkerGroup] = field(default_factory=list)
    reward_model: RoleHandle | None = None  # reward.model's workers, placed like the critic
    rollout: RoleHandle | None = None       # rollout.mode = "one_step_off": the separate rollout group
    teachers: dict[str, RoleHandle] = field(default_factory=dict)   # distill: name -> its teacher's workers
    prm: RoleHandle | None = None           # PRIME's implicit PRM, placed like the critic

    def shutdown(self) -> None:
        for group in self.groups:
            group.shutdown()


def start_workers(config, *, total_steps: int, needs_reference: bool, needs_critic: bool,
                  needs_prm: bool = False) -> Workers:
    """The actor+rollout(+ref) group on resources.workers ranks; the critic (and PRIME's implicit PRM)
    in the same ranks when resources.colocate (one process per rank holds both models), else in a pool
    of its own; with rollout.mode = "one_step_off" a separate rollout group on resources.rollout_workers ranks."""
    from rlctl.workers.actor import ActorRolloutRefWorker
    from rlctl.workers.critic import CriticWorker
    from rlctl.workers.prime_rm import ImplicitPRMWorker

    actor_spec = (ActorRolloutRefWorker, {"config": config, "total_steps": total_steps,
                                          "with_ref": needs_reference})
    critic_spec = (CriticWorker, {"config": config, "total_steps": total_steps})
    roles = {"actor": actor_spec}
    if needs_critic and config.resources.colocate:
        roles["critic"] = critic_spec
    prm_spec = (ImplicitPRMWorker, {"config": config, "total_steps": total_steps})
    if needs_prm and config.resources.colocate:
        roles["prm"] = prm_spec
    rm_spec = _reward_model_spec(config)
    if rm_spec and config.resources.colocate:
        roles["reward_model"] = rm_spec
    teachers = teacher_specs(config)
    if config.resources.colocate:
        roles.update(teachers)
    actor_resources, rollout_resources = pool_resources(config)
    groups = [WorkerGroup(ResourcePool(actor_resources, name="actor"), roles, name="actor")]
    try:
        if teachers and not config.resources.colocate:
            groups.append(WorkerGroup(ResourcePool(config.resources, name="teacher"), teachers, name="teacher"))
        if needs_critic and not config.resources.colocate:
            groups.append(WorkerGroup(ResourcePool(config.resources, name="critic"), {"critic": critic_spec},
                                      name="critic"))
        if needs_prm and not config.resources.colocate:
            groups.append(WorkerGroup(ResourcePool(config.resources, name="prm"), {"prm": prm_spec}, name="prm"))
        if rm_spec and not config.resources.colocate:
            groups.append(WorkerGroup(ResourcePool(config.resources, name="reward_model"),
                                      {"reward_model": rm_spec}, name="reward_model"))
        if rollout_resources is not None:
            groups.append(_rollout_group(config, rollout_resources))
    except BaseException:
        groups[0].shutdown()
        raise
    critic = next(g.role("critic") for g in groups if "critic" in g.role_classes) if needs_critic else None
    reward_model = next(g.role("reward_model") for g in groups if "reward_model" in g.role_classes) if rm_spec else None
    rollout = next((g.role("rollout") for g in groups if "rollout" in g.role_classes), None)
    prm = next((g.role("prm") for g in groups if "prm" in g.role_classes), None)
    return Workers(actor=groups[0].role("actor"), critic=critic, groups=groups, reward_model=reward_model,
                   rollout=rollout, prm=prm, teachers={role.removeprefix(TEACHER_ROLE): g.role(role) for g in groups
                                              for role in g.role_classes if role.startswith(TEACHER_ROLE)})


TEACHER_ROLE = "teacher:"   # a teacher's role name is this prefix + its name in [distill.teachers]


def teacher_specs(config) -> dict:
    """One role per teacher of distill.teacher / [distill.teachers] (a single teacher is named
    "teacher"); none for a teacher_url (the controller calls it) or without distillation."""
    d = config.distill
    paths = dict(d.teachers) or ({"teacher": d.teacher} if d.teacher else {})
    if not paths:
        return {}
    from rlctl.workers.teacher import TeacherWorker

    return {TEACHER_ROLE + name: (TeacherWorker, {"config": config, "path": path}) for name, path in paths.items()}


def pool_resources(config):
    """The [resources] the actor's pool and the separate rollout group's pool are made of (None
    for the rollout: no separate group). On CPU the rollout group is resources.rollout_workers
    ranks of cpus_per_worker CPUs beside the actor's resources.workers. On GPUs (one node) it is
    resources.rollout_workers ranks of one GPU each, and the actor group gets the node's other
    gpus_per_node - rollout_workers GPUs (rlctl.workers.rollout.checks.check_one_step_off checks
    the counts)."""
    import dataclasses

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


def _rollout_group(config, resources) -> WorkerGroup:
    """The separate rollout group on `resources` (pool_resources), one RolloutWorker (its own copy
    of the policy, and its engine) per rank."""
    from rlctl.workers.rollout_worker import RolloutWorker

    return WorkerGroup(ResourcePool(resources, name="rollout"), {"rollout": (RolloutWorker, {"config": config})},
                       name="rollout")


def _reward_model_spec(config):
    """reward.model's worker role, or None when the run has no reward model."""
    if not config.reward.model:
        return None
    from rlctl.workers.reward_model import RewardModelWorker

    return (RewardModelWorker, {"config": config})
