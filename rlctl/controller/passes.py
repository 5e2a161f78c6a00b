"""The passes of a training step, one row per `made_by` of rlctl.algorithms.COLUMNS: the controller
call that fills the columns of that name, and whether this run runs it. `Trainer.step` runs the rows
a run has, in this order, between the rollout and the advantages:

    batch = rollouts.next(step)
    for p in run_passes(setup): batch = p.fill(setup, batch, step, metrics, timing)
    advantages; for p in run_passes(setup): p.train(...) where a pass's role learns from them; actor update

A pass runs when the run's needs (rlctl.algorithms.run_needs: the columns its estimator and policy
loss read, and its KL settings) name it, or, for a column the config turns on (`optional` in
COLUMNS), when the config does. A new column of an existing pass is one COLUMNS entry; a new pass is
that entry, a Needs field of its name (algorithms/registry.py) and one row here with its call.
Rows without a call are filled by the rollout itself (the reward's scores, its named extras).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from rlctl.controller import prime, rollout, selfplay
from rlctl.controller.advantage import apply_rollout_correction
from rlctl.controller.drift import check_drift, rollout_drift
from rlctl.controller.timing import phase
from rlctl.runtime.balance import balanced

# (setup, batch, step, metrics, timing) -> batch; `setup`: the run's rlctl.controller.setup.TrainSetup
Fill = Callable[[Any, Any, int, dict, dict], Any]


@dataclass(frozen=True)
class Pass:
    name: str                          # the made_by of the columns it fills
    on: Callable[[Any], bool]          # whether a run (its TrainSetup) runs it
    fill: Fill | None = None           # None: the rollout fills these columns
    train: Callable[[Any, Any, dict, dict], None] | None = None   # after the advantages: (setup, batch, metrics, timing)


def needed(setup) -> Callable[[Any], bool]:
    """A pass the run's needs name (Needs has a field per pass: rlctl.algorithms.run_needs)."""
    return lambda s: getattr(s.needs, setup)


def greedy_baseline(setup, batch, step: int, metrics: dict, timing: dict):
    """ReMax: score one greedy response per prompt; its score is each sample's baseline."""
    n = setup.config.rollout.n
    with phase(timing, "greedy_baseline"):
        greedy = rollout.generate(setup.actor, setup.rows_of(batch, n), seed=setup.seed_for(step, 0),
                                  tag=f"{step}.greedy", pad_token_id=setup.pad_token_id, mode="greedy")
        rollout.score(setup, greedy)
        batch["reward_baselines"] = np.repeat(greedy["scores"], n)
    return batch


def real_responses(setup, batch, step: int, metrics: dict, timing: dict):
    """SPIN: the data's reference answers, paired with the generations."""
    batch, more = selfplay.add_real_responses(batch, setup)
    metrics.update(more)
    return batch


def old_log_probs(setup, batch, step: int, metrics: dict, timing: dict):
    """old_log_prob recomputed by the trainer (and the engine's drift from it), or in bypass mode the
    rollout's own log-probs (the correction then runs inside the loss)."""
    config = setup.config
    if config.algorithm.rollout_correction.bypass_mode:
        batch["old_log_prob"] = batch["rollout_log_prob"]
        return batch
    with phase(timing, "old_log_prob"):
        batch = batch.union(setup.actor.compute_log_prob(balanced(batch, config.actor.micro_batch_max_tokens)))
    if "rollout_log_prob" in batch:
        metrics.update(rollout_drift(batch))
        if setup.rollouts.on_policy:   # an off-policy source drifts by design
            check_drift(config, step, metrics)
    return batch


def rollout_correction(setup, batch, step: int, metrics: dict, timing: dict):
    """algorithm.rollout_correction's IS weights (and rejections), from the recomputed old_log_prob."""
    metrics.update(apply_rollout_correction(batch, setup.config))
    return batch


def ref_log_probs(setup, batch, step: int, metrics: dict, timing: dict):
    """ref_log_prob; the reference first refreshed when a self-play iteration starts."""
    config = setup.config
    with phase(timing, "ref"):
        if selfplay.refresh_due(step, config.algorithm.ref_update_every):
            setup.actor.sync_reference()
        batch = batch.union(setup.actor.compute_ref_log_prob(balanced(batch, config.actor.micro_batch_max_tokens)))
    metrics.update(selfplay.spin_margin(batch))
    return batch


def teacher_log_probs(setup, batch, step: int, metrics: dict, timing: dict):
    with phase(timing, "teacher"):
        return setup.teachers.score(batch, metrics)


def process_rewards(setup, batch, step: int, metrics: dict, timing: dict):
    """PRIME: the implicit PRM learns from the outcomes and scores the tokens."""
    config = setup.config
    with phase(timing, "prm"):
        batch, more = prime.process_rewards(with_mini_batches(batch, "actor", config, setup.prm), config, setup.prm)
    metrics.update(more)
    return batch


def values(setup, batch, step: int, metrics: dict, timing: dict):
    config = setup.config
    with phase(timing, "values"):
        return batch.union(setup.critic.compute_values(balanced(batch, config.critic.micro_batch_max_tokens)))


def update_critic(setup, batch, metrics: dict, timing: dict) -> None:
    config = setup.config
    with phase(timing, "update_critic"):
        metrics.update(setup.critic.update_critic(with_mini_batches(batch, "critic", config, setup.critic)))


def with_mini_batches(batch, role: str, config, group):
    """The batch with meta["mini_batches"] set, so W workers take exactly one worker's optimizer steps.

    Mini-batches hold the batch plan's sequences (role.mini_batch_size prompts x rollout.n); a short
    (dynamic-sampling) batch gets fewer, and the count always divides the rows evenly over the workers.
    """
    from rlctl.config.plan import batch_plan, mini_batch_count
    from rlctl.runtime.batch import Batch

    per_mini = batch_plan(config, role).sequences_per_mini_batch
    if "real_response" in batch:   # SPIN: each generation travels with its reference-answer twin
        per_mini *= 2
    # an agent rollout's rows outnumber its episodes when some split; it set the plan's count itself
    count = mini_batch_count(len(batch), world=group.world_size, sequences_per_mini=per_mini,
                             preset=int(batch.meta.get("mini_batches", 0)))
    # a token budget: each mini-batch's rows spread over the workers by tokens (rlctl.runtime.balance)
    return balanced(Batch(batch.tensors, {**batch.meta, "mini_batches": count}),
                    getattr(config, role).micro_batch_max_tokens)


# In the order a step runs them: the reference answers join before any log-prob pass sees the rows,
# the teachers and the PRM read old_log_prob, the critic's values see the final rows.
PASSES: tuple[Pass, ...] = (
    Pass("rollout", on=lambda s: True),             # generate + reward: rollouts.next, before every row here
    Pass("reward_components", on=needed("reward_components")),   # the reward's named extras, with its score
    Pass("greedy_baseline", on=needed("greedy_baseline"), fill=greedy_baseline),
    Pass("real_response", on=needed("real_response"), fill=real_responses),
    Pass("old_log_prob", on=lambda s: s.recompute_old_log_prob or s.config.algorithm.rollout_correction.bypass_mode,
         fill=old_log_probs),
    Pass("rollout_correction", on=lambda s: s.recompute_old_log_prob, fill=rollout_correction),
    Pass("reference", on=needed("reference"), fill=ref_log_probs),
    Pass("teacher", on=lambda s: s.teachers is not None, fill=teacher_log_probs),
    Pass("implicit_prm", on=needed("implicit_prm"), fill=process_rewards),
    Pass("critic", on=needed("critic"), fill=values, train=update_critic),
)


def run_passes(setup) -> tuple[Pass, ...]:
    """The rows with a controller call that this run runs (its needs and config are fixed for the run)."""
    return tuple(p for p in PASSES if p.fill is not None and p.on(setup))
