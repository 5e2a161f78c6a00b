"""`build_setup`: a validated config -> a running `TrainSetup` (data, tokenizer, workers, reward,
logging). Every resource it starts (Ray, the worker groups, the reward pool, the logger, the live
display) is registered on an ExitStack, so every way out of `rlctl train` releases it.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

from rlctl.config.loader import LoadedConfig, config_to_dict
from rlctl.config.schema import Config
from rlctl.controller.paths import resolve_paths
from rlctl.controller.prompts import PromptLoader, VisionData, read_rows, render_prompts
from rlctl.controller.session import RunSession
from rlctl.controller.setup import TrainSetup

if TYPE_CHECKING:  # heavy (torch, ray): the annotations only name them
    from rlctl.algorithms.registry import Needs
    from rlctl.rollouts.base import RolloutPolicy
    from rlctl.workers.roles.groups import Workers


def build_data(config: Config, setup_notices: list, tools: list[dict]):
    """Tokenizer, training prompt loader and validation prompts (rendered once, up front); `tools`:
    the multi-turn tools' schemas, which the prompts show."""
    from rlctl.models.loading import policy_tokenizer

    tokenizer = policy_tokenizer(config.model)
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
                start_step: int = 0, workers: Workers | None = None, label: str | None = None) -> TrainSetup:
    """`workers`: this run's share of workers already started (several runs on one base,
    rlctl.controller.group, whose `label` prefixes the run's console lines); None: start them."""
    from rlctl import algorithms
    from rlctl.checkpoint.manager import CheckpointManager
    from rlctl.controller.display import LiveDisplay
    from rlctl.controller.distill import build_teachers
    from rlctl.controller.metrics_log import MetricsLogger
    from rlctl.controller.rollout_source import rollout_source
    from rlctl.multiturn.tools import load_tools
    from rlctl.plugins import import_plugins
    from rlctl.rewards.sources import build_reward
    from rlctl.rollouts.table import kind_of

    config = resolve_paths(loaded.config, loaded.base_dir)
    import_plugins(config.algorithm.plugins)   # the user's estimators / losses, before anything asks for them
    notices: list[str] = []
    mt = config.rollout.multi_turn
    tools = load_tools(mt.tools, loaded.base_dir) if mt.enable else []   # the prompts show them, the loop calls them
    tokenizer, loader, val_rows, train = build_data(config, notices, [t.schema for t in tools])
    total = config.run.total_steps or loader.steps_per_epoch * config.run.total_epochs
    algo = config.algorithm
    needs = algorithms.run_needs(config)   # once per run: the roles and the loop are handed these
    kl_ctrl = algorithms.make_kl_controller(algo.kl_ctrl, kl_coef=algo.kl_coef, target_kl=algo.kl_target,
                                            horizon=algo.kl_horizon)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    reward = stack.enter_context(build_reward(config.reward, loaded.base_dir))
    if not kind_of(config).own_reward(config):   # else no reward function runs
        reward.check_data_sources(sorted(train.data_sources))
    logger = stack.enter_context(MetricsLogger(run_dir, config.run.loggers, config.run.name, config_to_dict(config),
                                               start_step=start_step))
    if workers is None:
        workers = start_workers(config, total, needs, stack, address)
    if workers.reward_model is not None:
        reward.attach_model(workers.reward_model)
    actor = policy(config, workers, tokenizer, loaded.base_dir, tools, stack)
    display = stack.enter_context(LiveDisplay(total, start_step=start_step, title=config.run.name, label=label))
    roles = {**workers.trained(), "actor": actor}   # each trained role's <step>/<name>/ (the role table)
    session = RunSession(config=config, config_dir=loaded.base_dir, run_dir=run_dir, logger=logger, display=display,
                         checkpoints=CheckpointManager.for_run(run_dir, config.run.keep_last), roles=roles,
                         stateful={"loader": loader, "kl_ctrl": kl_ctrl}, notices=notices)
    setup = TrainSetup(session=session, tokenizer=tokenizer, pad_token_id=pad, loader=loader, val_rows=val_rows,
                       total_steps=total, needs=needs, kl_ctrl=kl_ctrl, actor=actor, roles=workers.roles,
                       reward=reward, teachers=build_teachers(config, workers))
    setup.rollouts = rollout_source(setup, workers)
    session.extras.append(setup.rollouts)   # a batch in flight goes into each checkpoint
    return setup


def policy(config: Config, workers: Workers, tokenizer, base: Path, tools: list, stack: ExitStack) -> RolloutPolicy:
    """The actor group as the trainer calls it, holding the run's kind of rollout (rlctl.rollouts) over it."""
    from rlctl.controller.setup import rollout_context
    from rlctl.rollouts.base import RolloutPolicy, build_rollout

    rollout = build_rollout(workers.actor, rollout_context(config, tokenizer, base, tools=tools))
    stack.callback(rollout.close)
    return RolloutPolicy(workers.actor, rollout)


def start_workers(config: Config, total_steps: int, needs: Needs, stack: ExitStack, address: str) -> Workers:
    """Embedded Ray (or the cluster at `address`) and the roles of the table the run has
    (rlctl.workers.roles.table: the actor group, and the critic, PRM, teachers, ... when needed)."""
    from rlctl.runtime.ray_env import ray_session
    from rlctl.workers.roles.groups import start_workers as start

    stack.enter_context(ray_session(address))
    workers = start(config, total_steps=total_steps, needs=needs)
    stack.callback(workers.shutdown)
    return workers
