"""Everything a training run holds, built once: data, tokenizer, workers, reward, logging.

`TrainSetup` is what the trainer reads; `RolloutSource` is the contract of its supply of batches
(rlctl.controller.rollout_source holds the sources, one per rollout.mode); `rollout_context` is what
every source builds the run's kind of rollout from (rlctl.rollouts).
rlctl.controller.build.build_setup makes a `TrainSetup` from a validated config. This module
imports none of them at run time, so every source can name `TrainSetup` without an import circle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np

from rlctl.config.schema import Config, distill_enabled, rollout_is_level
from rlctl.controller.prompts import PromptLoader, PromptRow
from rlctl.controller.session import RunSession

if TYPE_CHECKING:  # heavy (torch, transformers, ray): the annotations only name them
    from transformers import PreTrainedTokenizerBase

    from rlctl.algorithms.kl import AdaptiveKLController, FixedKLController
    from rlctl.algorithms.registry import Needs
    from rlctl.controller.display import LiveDisplay
    from rlctl.controller.distill import Teachers
    from rlctl.rewards.sources import RewardSources
    from rlctl.rollouts.base import RolloutContext, RolloutPolicy
    from rlctl.runtime.batch import Batch
    from rlctl.runtime.worker_group import RoleHandle


class RolloutSource(Protocol):
    """The trainer's supply of scored batches (rlctl.controller.rollout_source: one per rollout.mode)."""

    # False: batches come from older weights, so trainer/engine log-prob drift is expected, not a warning
    on_policy: bool

    def start(self, first_step: int) -> None:
        """Get ready to supply batches from `first_step` on (after any restore)."""

    def next(self, step: int) -> tuple[Batch, dict]:
        """Batch `step`, scored, and its rollout metrics (reward, timing/reward_s, ...)."""

    def after_update(self, step: int) -> dict:
        """The actor finished update `step`; returns the `timing/*` of what that took here."""

    def save(self, folder: Path) -> None:
        """Write what is in flight into a checkpoint's step folder."""

    def restore(self, folder: Path) -> None:
        """Take back what `save` wrote (resume)."""

    def close(self) -> None: ...


def recompute_old_log_prob(config: Config, needs: Needs | None = None, *, on_policy: bool) -> bool:
    """old_log_prob equals the policy's own log-prob (detached) when the rollout is used for exactly
    one optimizer step; it is recomputed otherwise, whenever KL in the reward, the estimator
    (needs.old_log_prob) or rollout correction needs it, when the rollout source is not
    on-policy (`on_policy`, the source's own: one_step_off's batch came from older weights), and
    with distillation (the student's log-probs against the teacher's make its advantages and
    metrics). Never with rollout_correction.bypass_mode, which takes the rollout's log-probs as
    old_log_prob. An engine that keeps its own weights (vLLM, SGLang) needs no pass of its own
    either: its kernels differ from the trainer's, but with one optimizer step the PPO ratio
    starts at the update's own log-probs all the same, and the update reports the drift between
    the engine's log-probs and those (actor/drift_*, checked before the step is saved: Trainer.step).
    actor.router_replay always runs it: the pass records the routes the update replays."""
    from rlctl.config.plan import batch_plan

    one_update = batch_plan(config, "actor").optimizer_steps_per_rollout == 1
    correction = config.algorithm.rollout_correction
    if correction.bypass_mode:   # old_log_prob is the rollout's own (verl's bypass mode)
        return False
    return (not one_update or config.algorithm.kl_in_reward or distill_enabled(config)
            or not on_policy or bool(needs is not None and needs.old_log_prob) or config.actor.router_replay
            or bool(rollout_is_level(config) or correction.rollout_rs))


@dataclass
class TrainSetup:
    """What `build_setup` started for one RL run; the trainer reads it. The run folder, its writers
    and the run's progress are the `session`'s (shared with SFT); the rest is RL's own."""

    session: RunSession
    tokenizer: PreTrainedTokenizerBase
    pad_token_id: int
    loader: PromptLoader
    val_rows: list[PromptRow]
    total_steps: int
    needs: Needs
    kl_ctrl: FixedKLController | AdaptiveKLController
    actor: RolloutPolicy                  # the actor group, holding the run's rollout (rlctl.rollouts)
    roles: dict[str, RoleHandle]          # every started role by name (rlctl.workers.roles.table)
    reward: RewardSources
    teachers: Teachers | None = None      # distill: the teachers that score the student's tokens
    rollouts: RolloutSource = field(init=False)   # chosen by rollout.mode once the rest is built

    @property
    def config(self) -> Config:
        return self.session.config

    @property
    def critic(self) -> RoleHandle | None:
        """None: the algorithm's needs have no critic (GRPO, ...)."""
        return self.roles.get("critic")

    @property
    def prm(self) -> RoleHandle | None:
        """PRIME: the implicit PRM that scores and learns from each batch (None: no such estimator)."""
        return self.roles.get("prm")

    @property
    def display(self) -> LiveDisplay:
        return self.session.display

    @property
    def recompute_old_log_prob(self) -> bool:
        return recompute_old_log_prob(self.config, self.needs, on_policy=self.rollouts.on_policy)

    def seed_for(self, step: int, round_: int) -> int:
        """The sampling seed of a generation call: a pure function of (run seed, step, round)."""
        return int(np.random.SeedSequence([self.config.run.seed, step, round_ + 2**20]).generate_state(1)[0])

    def rows_of(self, batch, n: int) -> list[PromptRow]:
        """The prompts of a prompt-major rollout batch (every n-th row)."""
        messages = batch["messages"][::n] if "messages" in batch else [[]] * len(batch["prompts"][::n])
        return [PromptRow(prompt_ids=ids[mask != 0].tolist(), data_source=ds, ground_truth=gt, extra_info=ei,
                          messages=m)  # the chat messages: a judge or reward model scores the greedy baseline too
                for m, ids, mask, ds, gt, ei in zip(messages, batch["prompts"][::n], batch["attention_mask"][::n, :batch["prompts"].shape[1]],
                                                 batch["data_source"][::n], batch["ground_truth"][::n],
                                                 batch["extra_info"][::n])]

    def log_step(self, step: int, metrics: dict, batch) -> None:
        self.session.logger.log(step, metrics)
        if "agent_episode" in batch:   # agent rollouts: the rows padding the batch are no samples
            batch = batch.select(np.flatnonzero(batch["agent_episode"] >= 0))
        k = min(self.config.run.log_samples, len(batch))
        if k:
            prompts = self.tokenizer.batch_decode([row[m != 0].tolist() for row, m in
                                                   zip(batch["prompts"][:k], batch["attention_mask"][:k, :batch["prompts"].shape[1]])])
            samples = [{"prompt": p, "response": r, "score": float(sc), "ground_truth": gt, "data_source": ds}
                       for p, r, sc, gt, ds in zip(prompts, batch["response_text"][:k], batch["scores"][:k],
                                                   batch["ground_truth"][:k], batch["data_source"][:k])]
            for r, sample in enumerate(samples):   # rlctl view's acc and len columns
                sample["response_length"] = int(batch["response_mask"][r].sum())
                if "acc" in batch:
                    sample["acc"] = float(batch["acc"][r])
            if "agent_failure" in batch:   # a failed agent episode's reason
                for sample, failure in zip(samples, batch["agent_failure"][:k]):
                    if failure:
                        sample["agent_failure"] = str(failure)
            if "policy_version" in batch:   # one_step_off: the weights (update count) that generated each
                for sample, version in zip(samples, batch["policy_version"][:k]):
                    sample["policy_version"] = int(version)
            self.session.logger.log_samples(step, samples)
        if self.config.run.log_rollouts:
            from rlctl.controller.rollout_log import write_rollouts

            write_rollouts(self.session.run_dir, step, batch, self.actor.rollout.record_fields)
        self.session.log_progress(step, metrics)


def rollout_context(config: Config, tokenizer, base: Path, *, tools: list | None = None) -> RolloutContext:
    """What every caller builds the run's rollout from (the actor's, a separate rollout group's)."""
    from rlctl.config.plan import batch_plan
    from rlctl.rollouts.base import RolloutContext
    from rlctl.workers.compute.models import eos_token_ids
    from rlctl.workers.rollout.registry import rollout_engine_info

    return RolloutContext(config, tokenizer, base, eos_token_ids(config.model.path, tokenizer),
                          engine_log_probs=rollout_engine_info(config.rollout.engine).reports_log_probs, tools=tools,
                          minibatches=batch_plan(config, "actor").mini_batches_per_step)
