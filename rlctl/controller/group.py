"""Several LoRA runs on one base: `rlctl train rlctl.toml --seeds 0,1,2` or `--sweep actor.lr=1e-4,2e-4`.

Each member is the run `rlctl train rlctl.toml ... KEY=VALUE run.name=<name>-<key><value>` would
start alone: its own run folder, config, seed, data order, adapter, optimizer, metrics, checkpoints
and `rlctl resume`. What they share is one actor group whose ranks load the base model once and give
each run a module tree over those same tensors with its own peft adapter (rlctl.workers.compute.models.
on_shared_weights). The controller runs step k of every member in turn, each the whole step of its
solo run (the same batch shapes, the same calls on the same module), so each member's weights and
metrics are its solo run's, bit for bit on one machine (tests/controller/test_group.py).

What cannot share one base is refused in one line (exit 2) before anything starts: full fine-tuning,
different base models or [resources], an engine with its own copy of the weights (vLLM, SGLang),
the separate rollout group, roles beside the actor (a critic, a reward model, teachers), more than
one rank, SFT, agent programs and multi-turn rollouts, LoRA dropout, and automatic restarts.
"""

from __future__ import annotations

import itertools
import re
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rlctl.errors import ConfigError, Interrupted, RlctlError, UsageError

if TYPE_CHECKING:
    from rlctl.config.loader import LoadedConfig
    from rlctl.controller.trainer import Trainer

# What every member must have alike: the base the group loads once, and the one actor group's ranks.
SHARED_KEYS = ("model.path", "model.trust_remote_code", "resources")


def sweep_members(seeds: str | None, sweeps: list[str]) -> list[tuple[str, list[str]]]:
    """(run-name suffix, overrides) of each member: the product of the `--sweep KEY=V1,V2` values
    (`--seeds 0,1,2` is `--sweep run.seed=0,1,2`), in the order given. [] when neither is given."""
    axes = []
    for word in ([f"run.seed={seeds}"] if seeds is not None else []) + list(sweeps):
        key, eq, values = word.partition("=")
        key = key.strip()
        options = [v.strip() for v in values.split(",") if v.strip()]
        if not eq or not key or not options:
            raise UsageError(f"--sweep {word!r} is not KEY=V1,V2,...", hint="e.g. --sweep actor.lr=1e-4,2e-4")
        if key in ("run.name", "run.output_dir"):
            raise UsageError(f"--sweep {key}: each member's run folder is named after run.name and the values "
                             "swept", hint="set run.name once; members are <run.name>-seed0, -seed1, ...")
        if any(key == k for k, _ in axes):
            raise UsageError(f"{key} is swept twice (--seeds is run.seed)", hint="give its values once")
        if len(set(options)) < len(options):
            raise UsageError(f"--sweep {key}: a value is given twice ({values})", hint="list each value once")
        axes.append((key, options))
    members = []
    for combo in itertools.product(*(options for _, options in axes)):
        pairs = [(key, value) for (key, _), value in zip(axes, combo)]
        suffix = "-".join(key.rpartition(".")[2] + re.sub(r"[^A-Za-z0-9._+-]", "_", value) for key, value in pairs)
        members.append((suffix, [f"{key}={value}" for key, value in pairs]))
    return members


def load_members(path: Path, overrides: list[str], members: list[tuple[str, list[str]]]) -> list[LoadedConfig]:
    """Each member's config, loaded as its solo `rlctl train PATH OVERRIDES...` would be given it."""
    from rlctl.config.loader import load_config

    name = load_config(path, overrides).config.run.name
    return [load_config(path, [*overrides, *more, f"run.name={name}-{suffix}"]) for suffix, more in members]


def check_members(members: list[LoadedConfig]) -> None:
    """Refuse, in one line each (exit 2), what cannot train as several runs on one base."""
    from rlctl.config.schema import SEPARATE_ROLLOUT_MODES
    from rlctl.controller.paths import resolve_paths
    from rlctl.models.vision import is_vision_model

    configs = [resolve_paths(m.config, m.base_dir) for m in members]   # model.path from the config's folder
    first = configs[0]
    for c in configs:
        name = c.run.name
        for key in SHARED_KEYS:
            if _value(c, key) != _value(first, key):
                raise ConfigError(f"{key} differs between {first.run.name} and {name}: several runs share one "
                                  "base model and one worker group", hint=f"sweep other keys than {key}")
        refusal = (
            c.model.lora.rank == 0 and ("model.lora.rank = 0 (full fine-tuning) trains the base itself: each run "
                                        "would need its own copy", "set model.lora.rank > 0"),
            c.run.kind != "rl" and ("run.kind = \"sft\" is not built for several runs yet", "train them one by one"),
            c.rollout.engine != "hf" and (f"rollout.engine = {c.rollout.engine!r} holds its own copy of the weights per "
                                          "run", "use rollout.engine = \"hf\""),
            c.rollout.mode in SEPARATE_ROLLOUT_MODES and (f"rollout.mode = {c.rollout.mode!r} loads a separate rollout "
                                                          "group per run", "use rollout.mode = \"sync\""),
            c.resources.workers * c.resources.nodes > 1 and ("more than one rank is not built yet: FSDP would shard "
                                                             "the base once per run", "set resources.workers = 1"),
            c.model.lora.dropout > 0 and ("model.lora.dropout draws from the worker's one random stream, which the "
                                          "runs would share: no run would be its solo run", "set model.lora.dropout = 0"),
            c.run.max_restarts > 0 and ("run.max_restarts: restarting a group is not built yet",
                                        "set run.max_restarts = 0; rlctl resume continues each run"),
            (c.rollout.multi_turn.enable or bool(c.rollout.agent.function or c.rollout.agent.command))
            and ("multi-turn rollouts and agent programs are not built for several runs yet", "train them one by one"),
            is_vision_model(c.model.path) and ("vision-language models are not built for several runs yet",
                                               "train them one by one"),
        )
        for why in refusal:
            if why:
                raise ConfigError(f"several runs on one base: {name}: {why[0]}", hint=why[1])
        if other := _other_roles(c):
            raise ConfigError(f"several runs on one base: {name} needs the role(s) {', '.join(other)} beside the "
                              "actor, which is not built yet", hint="use an algorithm without a critic (GRPO, RLOO, "
                                                                    "...) and a reward function")


def _value(config, dotted: str):
    for part in dotted.split("."):
        config = getattr(config, part)
    return config


def _other_roles(config) -> list[str]:
    """The role table's rows this run would start besides the actor (rlctl.workers.roles.table)."""
    from rlctl.algorithms import run_needs
    from rlctl.workers.roles.table import ACTOR, ROLES, RunRoles

    run = RunRoles(config, 1, run_needs(config))
    return [role.name for role in ROLES if role.placement != ACTOR and role.instances(run)]


@dataclass
class Member:
    """One run of the group: its config, run folder, lines to print, and (resume) checkpoint step and path."""

    loaded: LoadedConfig
    run_dir: Path
    notices: list[str]
    resume: tuple[int, Path] | None = None


def start_group(members: list[LoadedConfig], *, address: str | None, force: bool) -> None:
    """`rlctl train --seeds/--sweep`: every member's checks, then its folder claimed, then all trained."""
    from rlctl.config.loader import config_to_dict
    from rlctl.controller.paths import resolve_paths
    from rlctl.controller.run import checked_config
    from rlctl.controller.run_dir import claim_new_run_dir, run_dir_of, write_resolved_config

    members = [checked_config(m, address) for m in members]
    check_members(members)
    with ExitStack() as locks:
        runs = []
        for loaded in members:
            run_dir = run_dir_of(loaded.config, loaded.base_dir)
            lock, notices = claim_new_run_dir(run_dir, force=force)
            locks.enter_context(lock)
            write_resolved_config(run_dir, config_to_dict(resolve_paths(loaded.config, loaded.base_dir)))
            runs.append(Member(loaded, run_dir, notices))
        train_together(runs, address=address)


def resume_group(run_dirs: list[Path], *, address: str | None, overrides: list[str] = ()) -> None:
    """`rlctl resume RUN_DIR RUN_DIR ...`: each run from its newest valid checkpoint, together on one base."""
    from rlctl.checkpoint.run_lock import RunLock
    from rlctl.controller.checkpointing import prepare_resume
    from rlctl.controller.run import checked_config

    if len({d.resolve() for d in run_dirs}) < len(run_dirs):
        raise UsageError("a run folder is named twice", hint="name each run to resume once")
    with ExitStack() as locks:
        runs = []
        for run_dir in run_dirs:
            locks.enter_context(RunLock.acquire(run_dir, "resume"))
            loaded, notices, step, path = prepare_resume(run_dir, None, overrides)
            runs.append(Member(checked_config(loaded, address), run_dir, notices, (step, path)))
        check_members([m.loaded for m in runs])
        train_together(runs, address=address)


def train_together(runs: list[Member], *, address: str | None) -> None:
    """One actor group for all `runs`, each run's setup on its share, then step k of each in turn."""
    from rlctl.algorithms import run_needs
    from rlctl.checkpoint.run_folder import start_run
    from rlctl.controller import checkpointing
    from rlctl.controller.build import build_data, build_setup
    from rlctl.controller.paths import resolve_paths
    from rlctl.controller.signals import StopFlag
    from rlctl.controller.trainer import Trainer
    from rlctl.plugins import import_plugins
    from rlctl.runtime.ray_env import ray_session, resolve_address
    from rlctl.workers.roles.groups import start_shared_base
    from rlctl.workers.roles.table import RunRoles

    address = resolve_address(address, runs[0].loaded.config.resources.address)
    with ExitStack() as stack:
        stack.enter_context(ray_session(address))
        roles = []
        for member in runs:   # each run's worker arguments, as build_setup would start them
            config = resolve_paths(member.loaded.config, member.loaded.base_dir)
            import_plugins(config.algorithm.plugins)
            loader = build_data(config, [], [])[1]
            roles.append(RunRoles(config, config.run.total_steps or loader.steps_per_epoch * config.run.total_epochs,
                                  run_needs(config)))
        group, shares = start_shared_base(roles)
        stack.callback(group.shutdown)
        trainers = []
        for member, share in zip(runs, shares):
            name = member.loaded.config.run.name
            setup = build_setup(member.loaded, member.run_dir, stack, address=address, workers=share, label=name,
                                start_step=member.resume[0] if member.resume else 0)
            if member.resume:
                checkpointing.restore(setup.session, member.resume[1])
            start_run(member.run_dir, name=name, total_steps=setup.total_steps,
                      command="resume" if member.resume else "train",
                      resumed_from=member.resume[0] if member.resume else None)
            for line in member.notices + setup.session.notices:
                setup.display.print(line)
            trainers.append(Trainer(setup))
        _step_in_turn(trainers, stack.enter_context(StopFlag()))


def _step_in_turn(trainers: list[Trainer], stop) -> None:
    """Step 1 of every run, then step 2, ...; a run that has all its steps is finished at once. A stop
    (Ctrl-C) saves each unfinished run at its last step; a failure marks each unfinished run failed."""
    from rlctl.checkpoint.run_folder import finish_run
    from rlctl.controller import checkpointing

    open_runs = [t for t in trainers if t.setup.session.state.step < t.setup.total_steps]
    begun = list(open_runs)
    for trainer in trainers:   # resumed at its last step: nothing left to train
        if trainer not in open_runs:
            finish_run(trainer.setup.session.run_dir, status="finished", exit_code=0)
    try:
        for trainer in begun:
            trainer.begin()
        first = min(t.setup.session.state.step for t in trainers) + 1
        for step in range(first, max(t.setup.total_steps for t in trainers) + 1):
            for trainer in [t for t in open_runs if t.setup.session.state.step < step]:
                trainer.step(step)
                if step == trainer.setup.total_steps:
                    finish_run(trainer.setup.session.run_dir, status="finished", exit_code=0)
                    open_runs.remove(trainer)
            stop.check()
    except Interrupted as signal:
        for trainer in open_runs:
            session = trainer.setup.session
            checkpointing.save(session, session.state.step, final=True)
            finish_run(session.run_dir, status="interrupted", exit_code=signal.exit_code, error=signal.message)
        dirs = " ".join(str(t.setup.session.run_dir) for t in trainers)
        signal.hint = f"continue them together with: rlctl resume {dirs} (or each alone)"
        raise
    except BaseException as err:
        code, message = (err.exit_code, err.message) if isinstance(err, RlctlError) else (1, f"{type(err).__name__}: {err}")
        for trainer in open_runs:
            finish_run(trainer.setup.session.run_dir, status="failed", exit_code=code, error=message)
        raise
    finally:
        for trainer in begun:
            trainer.setup.rollouts.close()
