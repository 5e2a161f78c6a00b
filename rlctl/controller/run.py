"""Start or resume a training run: the run folder, run.json bookkeeping and every exit path."""

from __future__ import annotations

import sys
from contextlib import ExitStack
from pathlib import Path

from rlctl.config.loader import LoadedConfig, config_to_dict
from rlctl.data.image_checks import DATA_PROBLEM
from rlctl.errors import ConfigError, DataError, Interrupted, RlctlError, WorkerDiedError


def _resolve_auto(loaded: LoadedConfig, address: str | None) -> LoadedConfig:
    """resources.gpus_per_node = "auto" -> a number, once, before the run folder records the config."""
    from rlctl.validate import resolve_auto
    from rlctl.runtime.ray_env import resolve_address

    return resolve_auto(loaded, resolve_address(address, loaded.config.resources.address))[0]


def _model_from_run(loaded: LoadedConfig) -> LoadedConfig:
    """model.path = an rlctl run folder (an SFT run, say): its newest checkpoint, merged into
    <run>/hf/step_<N> once; the run records that folder as its model.path."""
    import dataclasses

    from rlctl.checkpoint.run_folder import named_run_folder, run_model

    folder = named_run_folder(loaded.config.model.path, loaded.base_dir)
    if folder is None:
        return loaded

    model = dataclasses.replace(loaded.config.model, path=str(run_model(folder)))
    return dataclasses.replace(loaded, config=dataclasses.replace(loaded.config, model=model))


def _check(loaded: LoadedConfig) -> None:
    """Refuse to start on any config error (the same checks as `rlctl config validate`; the reward
    services are reached once, by build_reward, where an unreachable one is an error)."""
    from rlctl.validate import validate

    problems, _ = validate(loaded, reach_services=False)
    errors = [p for p in problems if p.severity == "error"]
    for p in problems:   # the run does other than the config asks (model.lora.sync): say so, once
        if p.severity == "warning" and p.key == "model.lora.sync" and not errors:
            print(f"warning: {p.format()}", file=sys.stderr)
    if errors and all(p.kind == DATA_PROBLEM for p in errors):   # bad rows or images: a data error (exit 3)
        raise DataError("; ".join(p.format() for p in errors) + " (nothing was started)")
    if len(errors) == 1:   # one problem, one line
        source = str(loaded.path) if loaded.path else "overrides"
        raise ConfigError(f"{errors[0].placed(source, loaded.lines)} (nothing was started)")
    if errors:
        source = str(loaded.path) if loaded.path else "overrides"
        raise ConfigError(f"{len(errors)} problem(s) in {source}; nothing was started",
                          [p.placed(source, loaded.lines) for p in errors])


def checked_config(loaded: LoadedConfig, address: str | None) -> LoadedConfig:
    """The config a new run starts with: "auto" values resolved, a run folder as model.path made a
    model, every check passed (else the one-line refusal: nothing was started)."""
    loaded = _model_from_run(_resolve_auto(loaded, address))
    _check(loaded)
    return loaded


def start_training(loaded: LoadedConfig, *, address: str | None, force: bool) -> None:
    from rlctl.controller.run_dir import claim_new_run_dir, run_dir_of, write_resolved_config
    from rlctl.controller.paths import resolve_paths

    loaded = checked_config(loaded, address)
    run_dir = run_dir_of(loaded.config, loaded.base_dir)
    lock, notices = claim_new_run_dir(run_dir, force=force)
    with lock:   # held by this process to its end: restarts (run.max_restarts) happen inside _run
        write_resolved_config(run_dir, config_to_dict(resolve_paths(loaded.config, loaded.base_dir)))
        _run(loaded, run_dir, address=address, command="train", notices=notices)


def resume_training(run_dir: Path, *, step: int | None, address: str | None, overrides: list[str] = ()) -> None:
    from rlctl.checkpoint.run_lock import RunLock
    from rlctl.controller.checkpointing import prepare_resume

    with RunLock.acquire(run_dir, "resume"):   # before prepare_resume trims the logs
        loaded, notices, ckpt_step, ckpt_path = prepare_resume(run_dir, step, overrides)
        loaded = _resolve_auto(loaded, address)
        _check(loaded)
        if _already_finished(run_dir, ckpt_step, ckpt_path, overrides):
            return
        _run(loaded, run_dir, address=address, command="resume", notices=notices, resume=(ckpt_step, ckpt_path),
             exact=step is not None)


def _signal_killed_the_workers(stop, session) -> Interrupted:
    """A SIGTERM sent to the whole process group (a service manager, `timeout`) also reaches Ray's
    raylet, whose shutdown kills the worker ranks before the controller's safe point: the run
    stops as asked (exit 143), without the final checkpoint, and says where resume will start."""
    from rlctl.controller.signals import stopped

    saved = [c["step"] for c in session.checkpoints.listing() if c["valid"]]
    where = f"rlctl resume continues from step {max(saved)}" if saved else "no checkpoint was saved yet"
    return stopped(stop.signum, f", which also reached Ray's own processes: the workers ended before "
                                f"step {session.state.step + 1} could finish or be saved; {where}")


def _already_finished(run_dir: Path, ckpt_step: int, ckpt_path: Path, overrides) -> bool:
    """A finished run resumed from its last step with the same length: say so, start nothing (when
    that step's content is intact: a damaged one is loaded, so its ranks find it and resume falls back)."""
    from rlctl.checkpoint.manifest import verify
    from rlctl.checkpoint.run_folder import read_run_info

    info = read_run_info(run_dir)
    longer = any(w.startswith(("run.total_steps=", "run.total_epochs=")) for w in overrides)
    if info.get("status") != "finished" or info.get("total_steps") != ckpt_step or longer:
        return False
    if verify(ckpt_path, hashes=True):
        return False
    print(f"{run_dir.name} already finished at step {ckpt_step}/{ckpt_step}; nothing to do "
          f"(to train longer: rlctl resume {run_dir} run.total_steps=N)")
    return True


def _run(loaded: LoadedConfig, run_dir: Path, *, address: str | None, command: str, notices: list,
         resume: tuple | None = None, exact: bool = False) -> None:
    """Train until done; with run.max_restarts, a lost worker restarts the groups from the newest
    valid checkpoint (rlctl.controller.recovery) until the budget is spent. A shard that a rank
    finds corrupted as it loads it: the previous valid step, unless `exact` (resume --step N)."""
    from rlctl.checkpoint.run_folder import finish_run
    from rlctl.controller.checkpointing import fall_back
    from rlctl.controller.recovery import Restarts, WorkerLost
    from rlctl.errors import CorruptCheckpointError

    restarts = Restarts.of_run(loaded.config, run_dir, command=command)
    while True:
        try:
            return _attempt(loaded, run_dir, address=address, command=command, notices=notices, resume=resume,
                            restarts=restarts)
        except (CorruptCheckpointError, WorkerLost) as fault:
            try:
                if isinstance(fault, WorkerLost):
                    resume, notices = restarts.recover(fault.error)
                elif exact or resume is None:
                    raise
                else:
                    resume, notices = fall_back(run_dir, loaded.config.run.keep_last, resume[0], fault)
            except RlctlError as e:   # stopped while waiting, no checkpoint verifies, --step N is broken
                if restarts.used:     # this command marked the run as running
                    finish_run(run_dir, status="interrupted" if isinstance(e, Interrupted) else "failed",
                               exit_code=e.exit_code, error=e.message)
                raise


def _attempt(loaded: LoadedConfig, run_dir: Path, *, address: str | None, command: str, notices: list,
             resume: tuple | None, restarts) -> None:
    from rlctl.controller import checkpointing
    from rlctl.checkpoint.run_folder import finish_run, start_run, write_run_info
    from rlctl.controller.signals import StopFlag, startup_stop
    from rlctl.runtime.ray_env import resolve_address

    if loaded.config.run.kind == "sft":   # same run folder, checkpoints and exits; another loop
        from rlctl.controller.sft import SFTTrainer as Trainer, build_sft_setup as build_setup
    else:
        from rlctl.controller.build import build_setup
        from rlctl.controller.trainer import Trainer

    startup = startup_stop(run_dir)   # a stop while starting: at the next safe point, or a watchdog ends it
    with ExitStack() as stack:
        stack.callback(startup.disarm)   # runs last: the watchdog also bounds the unwinding (ray.shutdown)
        try:
            with startup:
                setup = build_setup(loaded, run_dir, stack, start_step=resume[0] if resume else 0,
                                    address=resolve_address(address, loaded.config.resources.address))
                startup.check()
            session = setup.session
            stop = stack.enter_context(StopFlag())   # from here on: stop at the next safe point
            if resume:
                checkpointing.restore(session, resume[1])
        except Interrupted as e:   # nothing trained in this session: the run folder says so
            finish_run(run_dir, status="interrupted", exit_code=e.exit_code, error=e.message)
            fresh = command == "train" and not resume
            e.hint = "run the same `rlctl train` again to start over" if fresh else f"continue with: rlctl resume {run_dir}"
            raise
        except WorkerDiedError as e:   # a rank lost while starting or loading
            _lost(run_dir, e, restarts)
        if restarts.used:
            write_run_info(run_dir, status="running", step=session.state.step)
        else:
            start_run(run_dir, name=loaded.config.run.name, total_steps=setup.total_steps, command=command,
                      resumed_from=resume[0] if resume else None, restarts=restarts.total)
        if restarts.max_restarts:
            session.logger.every_row["run/restarts"] = restarts.total
        for line in notices + session.notices:
            session.display.print(line)
        try:
            Trainer(setup).fit(stop)
        except Interrupted as e:
            _stop(session, e)
        except WorkerDiedError as e:
            if not stop.signum:
                _lost(run_dir, e, restarts)
            stopped = _signal_killed_the_workers(stop, session)   # the user's stop, not a crash
            finish_run(run_dir, status="interrupted", exit_code=stopped.exit_code, error=stopped.message)
            stopped.hint = f"continue with: rlctl resume {run_dir}"
            raise stopped from None
        except RlctlError as e:
            finish_run(run_dir, status="failed", exit_code=e.exit_code, error=e.message)
            raise
        except BaseException as e:
            finish_run(run_dir, status="failed", exit_code=1, error=f"{type(e).__name__}: {e}")
            raise
        finish_run(run_dir, status="finished", exit_code=0)


def _stop(session, signal: Interrupted) -> None:
    """Ctrl-C / SIGTERM reached the loop's safe point: the final checkpoint, then exit 130 / 143.
    A second signal (StopNow) skips that save, or abandons it half-way (the save is undone)."""
    from rlctl.controller import checkpointing
    from rlctl.checkpoint.run_folder import finish_run
    from rlctl.controller.signals import StopNow

    try:
        if not isinstance(signal, StopNow):
            checkpointing.save(session, session.state.step, final=True)
    except StopNow as now:
        signal = now
    except RlctlError as err:   # the stop's checkpoint could not be written (a full disk)
        finish_run(session.run_dir, status="failed", exit_code=err.exit_code, error=err.message)
        raise
    finish_run(session.run_dir, status="interrupted", exit_code=signal.exit_code, error=signal.message)
    signal.hint = f"continue with: rlctl resume {session.run_dir}"
    raise signal from None


def _lost(run_dir: Path, error: WorkerDiedError, restarts) -> None:
    """A lost worker: WorkerLost (restart) while the budget has room, else the run fails with exit 4."""
    from rlctl.checkpoint.run_folder import finish_run
    from rlctl.controller.recovery import WorkerLost

    if restarts.left > 0:
        raise WorkerLost(error) from None
    if restarts.max_restarts:
        error.message += f" (after {restarts.used} restart(s), run.max_restarts = {restarts.max_restarts})"
        error.args = (error.message if error.hint is None else f"{error.message} ({error.hint})",)
    finish_run(run_dir, status="failed", exit_code=error.exit_code, error=error.message)
    raise error
