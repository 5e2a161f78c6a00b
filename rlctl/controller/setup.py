"""Everything a training run holds, built once: data, tokenizer, workers, reward, logging.

`build_setup` turns a validated config into a `TrainSetup`; every resource it starts (Ray, the
worker groups, the reward pool, the logger, the live display) is registered on an ExitStack, so
every way out of `rlctl train` releases it.
"""

from __future__ import annotations

import dataclasses
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rlctl.config.loader import LoadedConfig, config_to_dict
from rlctl.config.schema import Config, rollout_is_level
from rlctl.controller.prompts import PromptLoader, PromptRow, read_rows, render_prompts

if TYPE_CHECKING:  # heavy (torch, transformers, ray): the annotations only name them
    from transformers import PreTrainedTokenizerBase

    from rlctl.algorithms.kl import AdaptiveKLController, FixedKLController
    from rlctl.algorithms.registry import Needs
    from rlctl.checkpoint.manager import CheckpointManager
    from rlctl.controller.display import LiveDisplay
    from rlctl.controller.logging import MetricsLogger
    from rlctl.rewards.sources import RewardSources
    from rlctl.runtime.worker_group import RoleHandle
    from rlctl.workers.groups import Workers


def resolve_paths(config: Config, base: Path) -> Config:
    """Paths in rlctl.toml are relative to the file; workers (and `rlctl resume`, which reads the run's
    config.resolved.toml) see them from elsewhere, so make them absolute."""
    def absolute(p: str) -> str:
        path = Path(p).expanduser()
        return str(path if path.is_absolute() else (base / path).resolve())

    from rlctl.models.hub import looks_local

    model_path = config.model.path
    if looks_local(model_path, base):
        model_path = absolute(model_path)
    data = dataclasses.replace(config.data, train_files=tuple(map(absolute, config.data.train_files)),
                               val_files=tuple(map(absolute, config.data.val_files)))
    reward = config.reward
    if ":" in reward.function:
        file, _, fn = reward.function.rpartition(":")
        reward = dataclasses.replace(reward, function=f"{absolute(file)}:{fn}")
    if reward.model and looks_local(reward.model, base):
        reward = dataclasses.replace(reward, model=absolute(reward.model))  # a folder, not a hub id
    run = dataclasses.replace(config.run, output_dir=absolute(config.run.output_dir))
    multi_turn = _absolute_specs(config.rollout.multi_turn, absolute)
    algorithm = dataclasses.replace(config.algorithm, plugins=tuple(map(absolute, config.algorithm.plugins)))
    return dataclasses.replace(config, model=dataclasses.replace(config.model, path=model_path), data=data,
                               reward=reward, run=run, algorithm=algorithm,
                               rollout=dataclasses.replace(config.rollout, multi_turn=multi_turn))


def _absolute_specs(mt, absolute):
    """[rollout.multi_turn] with "file.py:name" tools and interaction made absolute (built-ins stay)."""
    def spec(value: str) -> str:
        file, _, name = value.rpartition(":")
        return f"{absolute(file)}:{name}" if file else value

    return dataclasses.replace(mt, tools=tuple(map(spec, mt.tools)), interaction=spec(mt.interaction))


def recompute_old_log_prob(config: Config, needs: Needs | None = None) -> bool:
    """old_log_prob equals the policy's own log-prob (detached) when the rollout is used for exactly
    one optimizer step; it is recomputed otherwise, whenever KL in the reward, the estimator
    (needs.old_log_prob) or rollout correction needs it, in one-step off-policy mode (the batch
    came from older weights), and with an engine that keeps its own weights (its kernels and dtype differ from the trainer's: the PPO ratio must start at the
    trainer's own log-probs, and the drift between the two is a metric). Never with
    rollout_correction.bypass_mode, which takes the rollout's log-probs as old_log_prob."""
    from rlctl.config.plan import batch_plan
    from rlctl.workers.rollout.registry import rollout_engine_info

    one_update = batch_plan(config, "actor").optimizer_steps_per_rollout == 1
    correction = config.algorithm.rollout_correction
    if correction.bypass_mode:   # old_log_prob is the rollout's own (verl's bypass mode)
        return False
    return (not one_update or config.algorithm.kl_in_reward or rollout_engine_info(config.rollout.engine).owns_weights
            or config.rollout.mode == "one_step_off" or bool(needs is not None and needs.old_log_prob)
            or bool(rollout_is_level(config) or correction.rollout_rs))


@dataclass
class TrainSetup:
    """What `build_setup` started for one run; the trainer and checkpointing read it."""

    config: Config
    config_dir: Path
    run_dir: Path
    tokenizer: PreTrainedTokenizerBase
    pad_token_id: int
    loader: PromptLoader
    val_rows: list[PromptRow]
    total_steps: int
    needs: Needs
    kl_ctrl: FixedKLController | AdaptiveKLController
    actor: RoleHandle
    critic: RoleHandle | None
    reward: RewardSources
    logger: MetricsLogger
    display: LiveDisplay
    checkpoints: CheckpointManager
    state: dict = field(default_factory=lambda: {"step": 0})
    notices: list[str] = field(default_factory=list)
    rollout: RoleHandle | None = None   # rollout.mode = "one_step_off": the separate rollout group
    pipeline: object = None             # rlctl.controller.offpolicy.OneStepOff, made by the trainer

    @property
    def recompute_old_log_prob(self) -> bool:
        return recompute_old_log_prob(self.config, self.needs)

    def save(self, step: int, *, final: bool = False) -> Path | None:
        """Write checkpoint `step` (rlctl.controller.checkpointing.save)."""
        from rlctl.controller.checkpointing import save

        return save(self, step, final=final)

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
        from rlctl.controller.status import write_run_info

        self.logger.log(step, metrics)
        k = min(self.config.run.log_samples, len(batch))
        if k:
            prompts = self.tokenizer.batch_decode([row[m != 0].tolist() for row, m in
                                                   zip(batch["prompts"][:k], batch["attention_mask"][:k, :batch["prompts"].shape[1]])])
            samples = [{"prompt": p, "response": r, "score": float(sc), "ground_truth": gt, "data_source": ds}
                       for p, r, sc, gt, ds in zip(prompts, batch["response_text"][:k], batch["scores"][:k],
                                                   batch["ground_truth"][:k], batch["data_source"][:k])]
            if "policy_version" in batch:   # one_step_off: the weights (update count) that generated each
                for sample, version in zip(samples, batch["policy_version"][:k]):
                    sample["policy_version"] = int(version)
            self.logger.log_samples(step, samples)
        if self.config.run.log_rollouts:
            from rlctl.controller.rollout_log import write_rollouts

            write_rollouts(self.run_dir, step, batch)
        self.display.update(step, metrics)
        write_run_info(self.run_dir, step=step)


def build_data(config: Config, setup_notices: list, tools: list[dict]):
    """Tokenizer, training prompt loader and validation prompts (rendered once, up front); `tools`:
    the multi-turn tools' schemas, which the prompts show."""
    from rlctl.workers.models import load_tokenizer

    tokenizer = load_tokenizer(config.model.path, config.model.trust_remote_code)
    train = render_prompts(read_rows([Path(p) for p in config.data.train_files]), tokenizer,
                           config.data.max_prompt_length, config.data.overlong_prompts, tools=tools)
    if train.filtered or train.truncated:
        setup_notices.append(f"{train.filtered} prompt(s) over data.max_prompt_length = "
                             f"{config.data.max_prompt_length} filtered, {train.truncated} truncated")
    loader = PromptLoader(train, config.data.batch_size, seed=config.run.seed, shuffle=config.data.shuffle)
    val_rows = []
    if config.data.val_files:
        val_rows = render_prompts(read_rows([Path(p) for p in config.data.val_files]), tokenizer,
                                  config.data.max_prompt_length, config.data.overlong_prompts, tools=tools).rows
    return tokenizer, loader, val_rows, train


def build_setup(loaded: LoadedConfig, run_dir: Path, stack: ExitStack, *, address: str = "",
                start_step: int = 0) -> TrainSetup:
    from rlctl import algorithms
    from rlctl.checkpoint.manager import CheckpointManager
    from rlctl.controller.display import LiveDisplay
    from rlctl.controller.logging import MetricsLogger
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
    actor = workers.actor
    if mt.enable:   # tools and interactions: the multi-turn loop generates
        from rlctl.multiturn.rollout import MultiTurnActor
        from rlctl.workers.models import eos_token_ids

        actor = MultiTurnActor(workers.actor, config, tokenizer, loaded.base_dir,
                               eos_token_ids(config.model.path, tokenizer), tools=tools)
        stack.callback(actor.close)
    display = stack.enter_context(LiveDisplay(total, start_step=start_step, title=config.run.name))
    checkpoints = CheckpointManager.for_run(run_dir, config.run.keep_last)
    return TrainSetup(config=config, config_dir=loaded.base_dir, run_dir=run_dir, tokenizer=tokenizer,
                      pad_token_id=pad, loader=loader, val_rows=val_rows, total_steps=total, needs=needs,
                      kl_ctrl=kl_ctrl, actor=actor, critic=workers.critic, reward=reward, logger=logger,
                      display=display, checkpoints=checkpoints, notices=notices, rollout=workers.rollout)


def start_workers(config: Config, total_steps: int, needs: Needs, stack: ExitStack, address: str) -> Workers:
    """Embedded Ray (or the cluster at `address`), the actor group and, when needed, the critic."""
    from rlctl.runtime.ray_env import ray_session
    from rlctl.workers.groups import start_workers as start

    stack.enter_context(ray_session(address))
    workers = start(config, total_steps=total_steps, needs_reference=needs.reference, needs_critic=needs.critic)
    stack.callback(workers.shutdown)
    return workers
