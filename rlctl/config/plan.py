"""The batch plan: how one step's prompts become sequences, mini-batches and micro-batches.

One pure function of the config, read by `rlctl config validate` (which prints it), the
controller (how many mini-batches a step's batch is split into) and the workers (how many
optimizer steps they take), so the three never disagree:

    data.batch_size prompts x rollout.n        = sequences per step
    role.mini_batch_size prompts (0: all)      = one optimizer step; ppo_epochs passes over them
    mini-batch sequences / workers             = each worker's share of an optimizer step,
    split into role.micro_batch_size rows      = its gradient-accumulation steps

Workers are resources.workers on CPU; on GPUs every GPU of every node is one (ResourcePool).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RolePlan:
    prompts_per_mini_batch: int         # role.mini_batch_size, or data.batch_size when 0
    sequences_per_mini_batch: int       # x rollout.n
    mini_batches_per_step: int          # data.batch_size / prompts_per_mini_batch (at least 1)
    optimizer_steps_per_rollout: int    # ppo_epochs x mini_batches_per_step
    sequences_per_worker: int           # of one mini-batch (at least 1)
    micro_batches_per_optimizer_step: int  # per worker: gradient-accumulation steps (at least 1)


def world_size(resources) -> int:
    """Ranks of a worker group: nodes x gpus_per_node on GPUs, else resources.workers (also while
    gpus_per_node is still "auto", before start-up resolves it)."""
    gpus = resources.gpus_per_node
    return resources.nodes * gpus if isinstance(gpus, int) and gpus > 0 else resources.workers


def batch_plan(config, role: str = "actor") -> RolePlan:
    """The plan of `role` ("actor" or "critic") for a full step's batch. No checks: validate
    reports the sizes that do not divide (rlctl.config.validate.check_batches)."""
    section, n, workers = getattr(config, role), config.rollout.n, world_size(config.resources)
    prompts = section.mini_batch_size or config.data.batch_size
    mini_batches = max(1, config.data.batch_size // prompts)
    per_worker = max(1, prompts * n // workers)
    return RolePlan(prompts_per_mini_batch=prompts, sequences_per_mini_batch=prompts * n,
                    mini_batches_per_step=mini_batches, optimizer_steps_per_rollout=section.ppo_epochs * mini_batches,
                    sequences_per_worker=per_worker,
                    micro_batches_per_optimizer_step=max(1, per_worker // section.micro_batch_size))
