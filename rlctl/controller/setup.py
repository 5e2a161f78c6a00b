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

import numpy as np

from rlctl.config.loader import LoadedConfig, config_to_dict
from rlctl.config.schema import Config
from rlctl.controller.prompts import PromptLoader, PromptRow, read_rows, render_prompts


def resolve_paths(config: Config, base: Path) -> Config:
    """Paths in rlctl.toml are relative to the file; workers (and `rlctl resume`, which reads the run's
    config.resolved.toml) see them from elsewhere, so make them absolute."""
    def absolute(p: str) -> str:
        path = Path(p).expanduser()
        return str(path if path.is_absolute() else (base / path).resolve())

    model_path = config.model.path
    if (base / model_path).exists() or model_path.startswith((".", "/", "~")):
        model_path = absolute(model_path)
    data = dataclasses.replace(config.data, train_files=tuple(map(absolute, config.data.train_files)),
                               val_files=tuple(map(absolute, config.data.val_files)))
    reward = config.reward
    if ":" in reward.function:
        file, _, fn = reward.function.rpartition(":")
        reward = dataclasses.replace(reward, function=f"{absolute(file)}:{fn}")
    run = dataclasses.replace(config.run, output_dir=absolute(config.run.output_dir))
    algorithm = dataclasses.replace(config.algorithm, plugins=tuple(map(absolute, config.algorithm.plugins)))
    return dataclasses.replace(config, model=dataclasses.replace(config.model, path=model_path), data=data,
                               reward=reward, run=run, algorithm=algorithm)


@dataclass
class TrainSetup:
    config: Config
    config_dir: Path
    run_dir: Path
    tokenizer: object
    pad_token_id: int
    loader: PromptLoader
    val_rows: list
    total_steps: int
    needs: object
    kl_ctrl: object
    actor: object = None
    critic: object = None
    reward: object = None
    logger: object = None
    display: object = None
    state: dict = field(default_factory=lambda: {"step": 0})
    checkpoints: object = None  # rlctl.checkpoint.manager.CheckpointManager
    save: object = None  # save(step, final=False), bound by rlctl.controller.run
    notices: list = field(default_factory=list)

    @property
    def recompute_old_log_prob(self) -> bool:
        """old_log_prob equals the policy's own log-prob (detached) when the rollout is used for exactly
        one optimizer step; it is recomputed otherwise, whenever KL in the reward needs it, and with
        a GPU engine (its kernels and dtype differ from the trainer's: the PPO ratio must start at
        the trainer's own log-probs, and the drift between the two is a metric)."""
        from rlctl.workers.rollout.registry import rollout_engine_info

        c = self.config
        mini = c.actor.mini_batch_size or c.data.batch_size
        one_update = c.actor.ppo_epochs == 1 and mini >= c.data.batch_size
        return not one_update or c.algorithm.kl_in_reward or rollout_engine_info(c.rollout.engine).owns_weights

    def seed_for(self, step: int, round_: int) -> int:
        """The sampling seed of a generation call: a pure function of (run seed, step, round)."""
        return int(np.random.SeedSequence([self.config.run.seed, step, round_ + 2**20]).generate_state(1)[0])

    def rows_of(self, batch, n: int) -> list[PromptRow]:
        """The prompts of a prompt-major rollout batch (every n-th row)."""
        return [PromptRow(prompt_ids=ids[mask != 0].tolist(), data_source=ds, ground_truth=gt, extra_info=ei,
                          messages=[])
                for ids, mask, ds, gt, ei in zip(batch["prompts"][::n], batch["attention_mask"][::n, :batch["prompts"].shape[1]],
                                                 batch["data_source"][::n], batch["ground_truth"][::n],
                                                 batch["extra_info"][::n])]

    def log_step(self, step: int, metrics: dict, batch) -> None:
        from rlctl.controller.status import write_run_info

        self.logger.log(step, metrics)
        k = min(self.config.run.log_samples, len(batch))
        if k:
            prompts = self.tokenizer.batch_decode([row[m != 0].tolist() for row, m in
                                                   zip(batch["prompts"][:k], batch["attention_mask"][:k, :batch["prompts"].shape[1]])])
            self.logger.log_samples(step, [
                {"prompt": p, "response": r, "score": float(sc), "ground_truth": gt, "data_source": ds}
                for p, r, sc, gt, ds in zip(prompts, batch["response_text"][:k], batch["scores"][:k],
                                            batch["ground_truth"][:k], batch["data_source"][:k])])
        self.display.update(step, metrics)
        write_run_info(self.run_dir, step=step)


def build_data(config: Config, setup_notices: list):
    """Tokenizer, training prompt loader and validation prompts (rendered once, up front)."""
    from rlctl.workers.models import load_tokenizer

    tokenizer = load_tokenizer(config.model.path, config.model.trust_remote_code)
    train = render_prompts(read_rows([Path(p) for p in config.data.train_files]), tokenizer,
                           config.data.max_prompt_length, config.data.overlong_prompts)
    if train.filtered or train.truncated:
        setup_notices.append(f"{train.filtered} prompt(s) over data.max_prompt_length = "
                             f"{config.data.max_prompt_length} filtered, {train.truncated} truncated")
    loader = PromptLoader(train, config.data.batch_size, seed=config.run.seed, shuffle=config.data.shuffle)
    val_rows = []
    if config.data.val_files:
        val_rows = render_prompts(read_rows([Path(p) for p in config.data.val_files]), tokenizer,
                                  config.data.max_prompt_length, config.data.overlong_prompts).rows
    return tokenizer, loader, val_rows, train


def build_setup(loaded: LoadedConfig, run_dir: Path, stack: ExitStack, *, address: str = "",
                start_step: int = 0) -> TrainSetup:
    from rlctl import algorithms as A
    from rlctl.controller.display import LiveDisplay
    from rlctl.controller.logging import MetricsLogger
    from rlctl.plugins import import_plugins
    from rlctl.rewards.runner import RewardRunner

    config = resolve_paths(loaded.config, loaded.base_dir)
    c = config
    import_plugins(c.algorithm.plugins)   # the user's estimators / losses, before anything asks for them
    notices: list[str] = []
    tokenizer, loader, val_rows, train = build_data(config, notices)
    total = c.run.total_steps or loader.steps_per_epoch * c.run.total_epochs
    needs = A.algorithm_needs(c.algorithm.name, kl_in_reward=c.algorithm.kl_in_reward,
                              use_kl_loss=c.actor.use_kl_loss)
    kl_ctrl = A.make_kl_controller(c.algorithm.kl_ctrl, kl_coef=c.algorithm.kl_coef,
                                   target_kl=c.algorithm.kl_target, horizon=c.algorithm.kl_horizon)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    s = TrainSetup(config=config, config_dir=loaded.base_dir, run_dir=run_dir, tokenizer=tokenizer,
                   pad_token_id=pad, loader=loader, val_rows=val_rows, total_steps=total, needs=needs,
                   kl_ctrl=kl_ctrl, notices=notices)
    s.reward = stack.enter_context(RewardRunner(c.reward.function, loaded.base_dir, timeout_s=c.reward.timeout_s,
                                                on_error=c.reward.on_error, workers=c.reward.workers,
                                                format_score=c.reward.format_score))
    s.reward.check_data_sources(sorted(train.data_sources))
    s.logger = stack.enter_context(MetricsLogger(run_dir, c.run.loggers, c.run.name, config_to_dict(c),
                                                 start_step=start_step))
    start_workers(s, stack, address)
    s.display = stack.enter_context(LiveDisplay(total, start_step=start_step, title=c.run.name))
    return s


def start_workers(s: TrainSetup, stack: ExitStack, address: str) -> None:
    """Embedded Ray (or the cluster at `address`), the actor group and, when needed, the critic."""
    from rlctl.runtime.ray_env import ray_session
    from rlctl.workers.groups import start_workers as start

    stack.enter_context(ray_session(address))
    workers = start(s.config, total_steps=s.total_steps, needs_reference=s.needs.reference,
                    needs_critic=s.needs.critic)
    stack.callback(workers.shutdown)
    s.actor, s.critic = workers.actor, workers.critic
