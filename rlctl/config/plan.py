"""The batch plan: how one step's prompts become sequences, mini-batches and micro-batches.

One pure function of the config, read by `rlctl config validate` (which prints it), the
controller (how many mini-batches a step's batch is split into) and the workers (how many
optimizer steps they take), so the three never disagree:

    data.batch_size prompts x rollout.n        = sequences per step
    role.mini_batch_size prompts (0: all)      = one optimizer step; ppo_epochs passes over them
    mini-batch sequences / workers             = each worker's share of an optimizer step,
    split into role.micro_batch_size rows      = its gradient-accumulation steps

Workers are resources.workers on CPU; on GPUs every GPU of every node is one (ResourcePool).
`BatchPlan` (RL) and `SFTPlan` are what `rlctl config validate` prints: the same formula, plus the
data's rows once the machine pass has read them.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlctl.config.schema import SEPARATE_ROLLOUT_MODES


@dataclass(frozen=True)
class RolePlan:
    prompts_per_mini_batch: int         # role.mini_batch_size, or data.batch_size when 0
    sequences_per_mini_batch: int       # x rollout.n
    mini_batches_per_step: int          # data.batch_size / prompts_per_mini_batch (at least 1)
    optimizer_steps_per_rollout: int    # ppo_epochs x mini_batches_per_step
    sequences_per_worker: int           # of one mini-batch (at least 1)
    micro_batches_per_optimizer_step: int  # per worker: gradient-accumulation steps (at least 1)


def world_size(resources, separate_rollout: bool = False) -> int:
    """Ranks of a worker group: nodes x gpus_per_node on GPUs, else resources.workers (also while
    gpus_per_node is still "auto", before start-up resolves it). `separate_rollout` (rollout.mode
    "one_step_off" / "async"): the actor's ranks, on GPUs those left beside the rollout group's
    resources.rollout_workers GPUs (rlctl.workers.roles.table.pool_resources)."""
    gpus = resources.gpus_per_node
    if not isinstance(gpus, int) or gpus <= 0:
        return resources.workers
    left = resources.nodes * gpus - (resources.rollout_workers if separate_rollout else 0)
    return max(left, 1)   # none left: refused at validate (rlctl.workers.rollout.checks), not a division by 0


def batch_plan(config, role: str = "actor") -> RolePlan:
    """The plan of `role` ("actor" or "critic") for a full step's batch. No checks: validate
    reports the sizes that do not divide (rlctl.validate.training.check_batches)."""
    separate = config.rollout.mode in SEPARATE_ROLLOUT_MODES
    section, n, workers = getattr(config, role), config.rollout.n, world_size(config.resources, separate)
    prompts = section.mini_batch_size or config.data.batch_size
    mini_batches = max(1, config.data.batch_size // prompts)
    per_worker = max(1, prompts * n // workers)
    return RolePlan(prompts_per_mini_batch=prompts, sequences_per_mini_batch=prompts * n,
                    mini_batches_per_step=mini_batches, optimizer_steps_per_rollout=section.ppo_epochs * mini_batches,
                    sequences_per_worker=per_worker,
                    micro_batches_per_optimizer_step=max(1, per_worker // section.micro_batch_size))


def mini_batch_count(rows: int, *, world: int, sequences_per_mini: int, preset: int = 0) -> int:
    """Mini-batches (optimizer steps per epoch) of a step's `rows` sequences over `world` workers: the
    plan's sequences per mini-batch each (or `preset`, a count the rollout chose), so a short
    (dynamic-sampling) batch gets fewer; lowered until the count splits the rows evenly over the
    workers. The controller decides it here for each update (rlctl.controller.trainer.with_mini_batches);
    a worker called without one asks the same."""
    count = preset or max(1, rows // max(1, sequences_per_mini))
    while count > 1 and rows % (world * count):
        count -= 1
    return count


@dataclass(frozen=True, kw_only=True)
class DataPlan:
    """What a plan knows once the training data is read (None before), and the node size."""
    train_rows: int | None
    steps_per_epoch: int | None
    total_steps: int | None
    gpus_per_node: int | str = "auto"   # as validated: "auto" only without the machine pass
    gpus_per_node_resolved: str = ""    # why "auto" became gpus_per_node ("" when it was a number)

    def data_rows(self) -> list[tuple[str, object]]:
        """The rows that depend on the training data (unknown before it is read)."""
        unknown = "unknown (data files not readable)"
        return [(label, unknown if value is None else value)
                for label, value in (("training rows", self.train_rows), ("steps per epoch", self.steps_per_epoch),
                                     ("total steps", self.total_steps))]


@dataclass(frozen=True, kw_only=True)
class BatchPlan(DataPlan):
    prompts_per_step: int
    sequences_per_step: int
    mini_batches_per_rollout: int  # optimizer steps per rollout = ppo_epochs x mini-batches
    micro_batches_per_optimizer_step: int  # per worker (gradient accumulation steps)
    sequences_per_worker_per_mini_batch: int
    micro_batch_max_tokens: int = 0   # actor.micro_batch_max_tokens: micro-batches cut by tokens instead

    def rows(self) -> list[tuple[str, object]]:
        budget = self.micro_batch_max_tokens
        return [("prompts per step", self.prompts_per_step),
                ("sequences per step", self.sequences_per_step),
                ("optimizer steps per rollout", self.mini_batches_per_rollout),
                ("micro-batches per optimizer step (per worker)",
                 f"by tokens, <= {budget} each" if budget else self.micro_batches_per_optimizer_step),
                ("sequences per worker per optimizer step", self.sequences_per_worker_per_mini_batch),
                *self.data_rows()]


def step_plan(config) -> BatchPlan:
    """The RL plan of a config before its data is read (rows, steps per epoch: unknown)."""
    actor = batch_plan(config, "actor")
    return BatchPlan(
        prompts_per_step=config.data.batch_size, sequences_per_step=config.data.batch_size * config.rollout.n,
        mini_batches_per_rollout=actor.optimizer_steps_per_rollout,
        micro_batches_per_optimizer_step=actor.micro_batches_per_optimizer_step,
        sequences_per_worker_per_mini_batch=actor.sequences_per_worker,
        micro_batch_max_tokens=config.actor.micro_batch_max_tokens, train_rows=None, steps_per_epoch=None,
        total_steps=config.run.total_steps or None, gpus_per_node=config.resources.gpus_per_node)


@dataclass(frozen=True, kw_only=True)
class SFTPlan(DataPlan):
    examples_per_step: int
    examples_per_worker: int
    micro_batching: str

    @property
    def sequences_per_step(self) -> int:
        return self.examples_per_step

    def rows(self) -> list[tuple[str, object]]:
        return [("run kind", "sft (one optimizer step per step)"), ("examples per step", self.examples_per_step),
                ("examples per worker per step", self.examples_per_worker),
                ("micro-batches (per worker)", self.micro_batching),
                *self.data_rows()]


def sft_plan(config, gpus_per_node_resolved: str = "") -> SFTPlan:
    """The SFT plan before its data is read: batch_size examples split over the workers."""
    budget, workers = config.sft.micro_batch_max_tokens, world_size(config.resources)
    return SFTPlan(examples_per_step=config.data.batch_size,
                   examples_per_worker=max(1, config.data.batch_size // workers),
                   micro_batching=(f"by length, <= {budget} tokens each (rows x longest)" if budget
                                   else f"by length, {config.actor.micro_batch_size} rows each"),
                   train_rows=None, steps_per_epoch=None, total_steps=config.run.total_steps or None,
                   gpus_per_node=config.resources.gpus_per_node, gpus_per_node_resolved=gpus_per_node_resolved)
