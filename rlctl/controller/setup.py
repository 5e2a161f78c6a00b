"""Everything a training run holds, built once: data, tokenizer, workers, reward, logging.

`build_setup` turns a validated config into a `TrainSetup`; every resource it starts (Ray, the
worker groups, the reward pool, the logger, the live display) is registered on an ExitStack, so
every way out of `rlctl train` releases it.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rlctl.config.loader import LoadedConfig, config_to_dict
from rlctl.config.schema import Config, distill_enabled, rollout_is_level
from rlctl.controller.paths import resolve_paths
from rlctl.controller.prompts import PromptLoader, PromptRow, VisionData, read_rows, render_prompts
from rlctl.controller.session import RunSession

if TYPE_CHECKING:  # heavy (torch, transformers, ray): the annotations only name them
    from transformers import PreTrainedTokenizerBase

    from rlctl.algorithms.kl import AdaptiveKLController, FixedKLController
    from rlctl.algorithms.registry import Needs
    from rlctl.controller.display import LiveDisplay
    from rlctl.controller.distill import Teachers
    from rlctl.controller.rollout_source import RolloutSource
    from rlctl.rewards.sources import RewardSources
    from rlctl.runtime.policy import PolicyActor
    from rlctl.runtime.worker_group import RoleHandle
    from rlctl.workers.groups import Workers


def recompute_old_log_prob(config: Config, needs: Needs | None = None) -> bool:
    """old_log_prob equals the policy's own log-prob (detached) when the rollout is used for exactly
    one optimizer step; it is recomputed otherwise, whenever KL in the reward, the estimator
    (needs.old_log_prob) or rollout correction needs it, when the rollout mode's source is not
    on-policy (one_step_off: the batch came from older weights), and with distillation (the
    student's log-probs against the teacher's make its advantages and metrics). Never with
    rollout_correction.bypass_mode, which takes the rollout's log-probs as old_log_prob.
    An engine that keeps its own weights (vLLM, SGLang) needs no pass of its own either: its
    kernels differ from the trainer's, but with one optimizer step the PPO ratio starts at the
    update's own log-probs all the same, and the update reports the drift between the engine's
    log-probs and those (actor/drift_*, checked before the step is saved: Trainer.steps)."""
    from rlctl.config.plan import batch_plan
    from rlctl.controller.rollout_source import MODES

    one_update = batch_plan(config, "actor").optimizer_steps_per_rollout == 1
    correction = config.algorithm.rollout_correction
    if correction.bypass_mode:   # old_log_prob is the rollout's own (verl's bypass mode)
        return False
    return (not one_update or config.algorithm.kl_in_reward or distill_enabled(config)
            or not MODES[config.rollout.mode].on_policy or bool(needs is not None and needs.old_log_prob)
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
    actor: PolicyActor
    critic: RoleHandle | None             # None: the algorithm's needs have no critic (GRPO, ...)
    reward: RewardSources
    teachers: Teachers | None = None      # distill: the teachers that score the student's tokens
    rollouts: RolloutSource = field(init=False)   # chosen by rollout.mode once the rest is built

    @property
    def config(self) -> Config:
        return self.session.config

    @property
    def display(self) -> LiveDisplay:
        return self.session.display

    @property
    def recompute_old_log_prob(self) -> bool:
        return recompute_old_log_prob(self.config, self.needs)

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
            if "policy_version" in batch:   # one_step_off: the weights (update count) that generated each
                for sample, version in zip(samples, batch["policy_version"][:k]):
                    sample["policy_version"] = int(version)
            self.session.logger.log_samples(step, samples)
        if self.config.run.log_rollouts:
            from rlctl.controller.rollout_log import write_rollouts

            write_rollouts(self.session.run_dir, step, batch)
        self.session.log_progress(step, metrics)


def build_data(config: Config, setup_notices: list, tools: list[dict]):
    """Tokenizer, training prompt loader and validation prompts (rendered once, up front); `tools`:
    the multi-turn tools' schemas, which the prompts show."""
    from rlctl.models.loading import load_tokenizer

    tokenizer = load_tokenizer(config.model.path, config.model.trust_remote_code)
    train = render_prompts(read_rows([Path(p) for p in config.data.train_files]), tokenizer,
                           config.data.max_prompt_length, config.data.overlong_prompts, tools=tools,
                           vision=vision_data(config, config.data.train_files))
    if train.filtered or train.truncated:
        setup_notices.append(f"{train.filtered} prompt(s) over data.max_prompt_length = "
                             f"{config.data.max_prompt_length} filtered, {train.truncated} truncated")
    loader = PromptLoader(train, config.data.batch_size, seed=config.run.seed, shuffle=config.data.shuffle)
    val_rows = []
    if config.data.val_files:
        val_rows = render_prompts(read_rows([Path(p) for p in config.data.val_files]), tokenizer,
                                  config.data.max_prompt_length, config.data.overlong_prompts, tools=tools,
                                  vision=vision_data(config, config.data.val_files)).rows
    return tokenizer, loader, val_rows, train


def vision_data(config: Config, files) -> VisionData | None:
    """How the rows of `files` are read for a vision-language model.path (None: a text model)."""
    from rlctl.models.vision import is_vision_model

    if not is_vision_model(config.model.path):
        return None
    return VisionData(config.model.path, config.data.image_key, ", ".join(Path(f).name for f in files))


def build_setup(loaded: LoadedConfig, run_dir: Path, stack: ExitStack, *, address: str = "",
                start_step: int = 0) -> TrainSetup:
    from rlctl import algorithms
    from rlctl.checkpoint.manager import CheckpointManager
    from rlctl.controller.display import LiveDisplay
    from rlctl.controller.distill import build_teachers
    from rlctl.controller.logging import MetricsLogger
    from rlctl.controller.rollout_source import rollout_source
    from rlctl.multiturn.tools import load_tools
    from rlctl.plugins import import_plugins
    from rlctl.rewards.sources import build_reward

    config = resolve_paths(loaded.config, loaded.base_dir)
    import_plugins(config.algorithm.plugins)   # the user's estimators / losses, before anything asks for them
    notices: list[str] = []
    mt = config.rollout.multi_turn
    tools = load_tools(mt.tools, loaded.base_dir) if mt.enable else []   # the prompts show them, the loop calls them
    tokenizer, loader, val_rows, train = build_data(config, notices, [t.schema for t in tools])
    total = config.run.total_steps or loader.steps_per_epoch * config.run.total_epochs
    algo = config.algorithm
    needs = algorithms.algorithm_needs(algo.name, kl_in_reward=algo.kl_in_reward,
                                       use_kl_loss=config.actor.use_kl_loss)
    kl_ctrl = algorithms.make_kl_controller(algo.kl_ctrl, kl_coef=algo.kl_coef, target_kl=algo.kl_target,
                                            horizon=algo.kl_horizon)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    reward = stack.enter_context(build_reward(config.reward, loaded.base_dir))
    reward.check_data_sources(sorted(train.data_sources))
    logger = stack.enter_context(MetricsLogger(run_dir, config.run.loggers, config.run.name, config_to_dict(config),
                                               start_step=start_step))
    workers = start_workers(config, total, needs, stack, address)
    if workers.reward_model is not None:
        reward.attach_model(workers.reward_model)
    actor = policy(config, workers, tokenizer, loaded.base_dir, tools, stack)
    display = stack.enter_context(LiveDisplay(total, start_step=start_step, title=config.run.name))
    roles = {"actor": actor, **({"critic": workers.critic} if workers.critic is not None else {})}
    session = RunSession(config=config, config_dir=loaded.base_dir, run_dir=run_dir, logger=logger, display=display,
                         checkpoints=CheckpointManager.for_run(run_dir, config.run.keep_last), roles=roles,
                         stateful={"loader": loader, "kl_ctrl": kl_ctrl}, notices=notices)
    setup = TrainSetup(session=session, tokenizer=tokenizer, pad_token_id=pad, loader=loader, val_rows=val_rows,
                       total_steps=total, needs=needs, kl_ctrl=kl_ctrl, actor=actor, critic=workers.critic,
                       reward=reward, teachers=build_teachers(config, workers))
    setup.rollouts = rollout_source(setup, workers)
    session.extras.append(setup.rollouts)   # a batch in flight goes into each checkpoint
    return setup


def policy(config: Config, workers: Workers, tokenizer, base: Path, tools: list, stack: ExitStack) -> PolicyActor:
    """The actor group as the trainer calls it; with multi-turn rollouts, the turn loop (tools and
    interactions) generates and the group does the rest."""
    from rlctl.runtime.policy import PolicyHandle

    actor = PolicyHandle(workers.actor)
    if not config.rollout.multi_turn.enable:
        return actor
    from rlctl.multiturn.rollout import MultiTurnActor
    from rlctl.workers.models import eos_token_ids
    from rlctl.workers.rollout.registry import rollout_engine_info

    multi = MultiTurnActor(actor, config, tokenizer, base, eos_token_ids(config.model.path, tokenizer), tools=tools,
                           engine_log_probs=rollout_engine_info(config.rollout.engine).reports_log_probs)
    stack.callback(multi.close)
    return multi


def start_workers(config: Config, total_steps: int, needs: Needs, stack: ExitStack, address: str) -> Workers:
    """Embedded Ray (or the cluster at `address`), the actor group and, when needed, the critic."""
    from rlctl.runtime.ray_env import ray_session
    from rlctl.workers.groups import start_workers as start

    stack.enter_context(ray_session(address))
    workers = start(config, total_steps=total_steps, needs_reference=needs.reference, needs_critic=needs.critic)
    stack.callback(workers.shutdown)
    return workers
