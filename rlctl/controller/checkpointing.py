"""Saving and restoring a run: what the trainer writes into a checkpoint, and how resume reads it.

A checkpoint step folder holds actor/ (and critic/, prm/: each trained role of the role table,
rlctl.workers.roles.table, its own folder): DCP shards of model + optimizer + schedule +
RNG per rank, written by the workers; trainer_state.json: global step, data-loader position,
KL-controller value, the best-checkpoint record so far (run.best_metric); config.resolved.toml:
the run's config. MANIFEST.json (written by the CheckpointManager, which makes the folder appear
atomically) carries the run's fingerprint (config + content hashes of model, tokenizer, data,
reward file), so resume can refuse a config that would break the run.
Generation seeds are a pure function of (seed, step, round), so no sampler state is needed.
What a step folder holds comes from the run's session (rlctl.controller.session.RunSession: its
roles, its stateful parts, its extras such as the one-step-off batch already generated for step + 1).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from rlctl.checkpoint.manifest import CONFIG_FILE, MANIFEST
from rlctl.errors import CheckpointError, CorruptCheckpointError
from rlctl.utils.atomic_files import atomic_write_text, write_failure

if TYPE_CHECKING:
    from rlctl.controller.session import RunSession

STATE_FILE = "trainer_state.json"


def checked_here(path: str) -> bool:
    """Whether the controller checks this checkpoint file's content before loading: not a trained
    role's shard (the role table's folders, actor/ critic/ prm/, which the ranks that load them check,
    each its share of the files: rlctl.workers.compute.checkpoint_io.verify_share)."""
    from rlctl.workers.roles.table import role_folders

    return not path.startswith(role_folders())


def fingerprint(session: RunSession) -> dict:
    from rlctl.checkpoint.compat import run_fingerprint
    from rlctl.config.loader import config_to_dict

    return run_fingerprint(config_to_dict(session.config), session.config_dir, session.config.model.path)


def save(session: RunSession, step: int, *, final: bool = False) -> Path | None:
    """Write checkpoint `step` (skipped when that step is already the newest saved one)."""
    if step == 0 or step == session.state.saved_step:
        return None
    import tomlkit

    from rlctl.checkpoint.run_lock import check_run_folder
    from rlctl.config.loader import config_to_dict

    check_run_folder(session.run_dir)   # a deleted live folder: stop rather than save into its successor

    def write(tmp: Path) -> None:
        for name, role in session.roles.items():   # each trained role's folder: each rank its shards
            role.save_checkpoint(str(tmp / name))
        state = {"step": step, **{name: part.state_dict() for name, part in session.stateful.items()},
                 "world_size": session.config.resources.workers, "best": session.state.best}
        atomic_write_text(tmp / STATE_FILE, json.dumps(state, indent=1) + "\n")
        for extra in session.extras:   # e.g. one_step_off: the batch generating for step + 1
            extra.save(tmp)
        atomic_write_text(tmp / CONFIG_FILE, tomlkit.dumps(config_to_dict(session.config)))
        check_run_folder(session.run_dir)   # before LATEST names it: the folder may have gone meanwhile

    with_notice = session.display.print if final else (lambda _msg: None)
    meta = {"run": session.config.run.name, "fingerprint": fingerprint(session)}
    try:
        path = session.checkpoints.save(step, write, meta=meta, best=session.state.best)
    except (CheckpointError, OSError) as err:   # the save was undone: the previous checkpoint stands
        if isinstance(err, OSError) and write_failure(err) is None:
            raise
        raise save_failed(session, step, err) from None
    session.state.saved_step = step
    with_notice(f"checkpoint saved: {path}")
    return path


def save_failed(session: RunSession, step: int, err: BaseException) -> CheckpointError:
    """One line for a save that could not be written (disk full, quota, a size limit, permission):
    what failed, how much the step needs against what is free, and which checkpoint still loads."""
    import shutil

    failed = write_failure(err)
    why = getattr(err, "message", None) or (f"could not write {failed.filename}: {failed.strerror}" if failed
                                             else str(err))
    manager = session.checkpoints
    saved = [c for c in manager.listing() if c["valid"] and c["step"] < step]
    if saved:
        need = f"about {_size(saved[-1]['bytes'])} (the size of step_{saved[-1]['step']})"
    else:
        need = f"about {_size(_estimate_bytes(session))} (12 bytes per trained parameter)"
    free = shutil.disk_usage(manager.dir if manager.dir.exists() else session.run_dir).free
    kept = (f"step_{saved[-1]['step']} is still the newest loadable checkpoint" if saved
            else "no earlier checkpoint exists")
    return CheckpointError(f"checkpoint step_{step} could not be saved: {why}; the step needs {need} and "
                           f"{_size(free)} is free there; {kept}",
                           hint=f"free space or fix permissions under {manager.dir}, then `rlctl resume "
                                f"{session.run_dir}`")


def _estimate_bytes(session: RunSession) -> int:
    """No checkpoint to compare with: float32 weights plus Adam's two moments per parameter of the
    model, once per trained role (actor, critic)."""
    import numpy as np

    from rlctl.checkpoint.compat import local_model_dir

    folder = local_model_dir(session.config.model.path, session.config_dir)
    params = 0
    if folder is not None:
        from safetensors import safe_open

        for file in folder.glob("*.safetensors"):
            with safe_open(str(file), "np") as f:
                for name in f.keys():
                    params += int(np.prod(f.get_slice(name).get_shape()))
    return 12 * params * len(session.roles)


def _size(n: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def prepare_resume(run_dir: Path, step: int | None, overrides: list[str] | tuple = ()):
    """Pick the checkpoint, check the config (plus `overrides`) still fits it, trim logs past it.

    Returns (loaded config, notices, checkpoint step, checkpoint path).
    """
    from rlctl.checkpoint.compat import check_resume, saved_fingerprint
    from rlctl.checkpoint.manager import CheckpointManager
    from rlctl.config.loader import load_config
    from rlctl.controller.metrics_log import truncate_logs

    config_path = run_dir / CONFIG_FILE
    if not config_path.is_file():
        raise CheckpointError(f"{run_dir} has no {CONFIG_FILE}", hint="pass a run folder made by `rlctl train`.")
    loaded = load_config(config_path, list(overrides))
    manager = CheckpointManager.for_run(run_dir, loaded.config.run.keep_last)
    notices = manager.clean_leftovers()
    # Sizes of every file, and the crc32 of those no rank loads, before anything starts; the ranks
    # check the shards as they load them (a corrupted one: fall_back, the previous valid step).
    ckpt_step, ckpt_path, warning = manager.latest_valid(step, hashes=True, content_of=checked_here)
    if warning:
        notices.append(warning)
    saved = saved_fingerprint(json.loads((ckpt_path / MANIFEST).read_text()))
    if saved is None:
        raise CheckpointError(f"{ckpt_path} has no run fingerprint in its {MANIFEST}",
                              hint="it was not written by `rlctl train`; start a new run instead")
    current = _current_fingerprint(loaded)
    notices += check_resume(saved, current)
    if overrides:
        import tomlkit

        from rlctl.config.loader import config_to_dict

        atomic_write_text(config_path, tomlkit.dumps(config_to_dict(loaded.config)))
    dropped = truncate_logs(run_dir, ckpt_step)
    notices.append(f"resuming from checkpoint step {ckpt_step}" + (f" ({dropped} log rows after it dropped)"
                                                                    if dropped else ""))
    return loaded, notices, ckpt_step, ckpt_path


def fall_back(run_dir: Path, keep_last: int, step: int, bad: CorruptCheckpointError) -> tuple[tuple, list[str]]:
    """A rank found a shard of checkpoint `step` corrupted as it loaded it: the newest earlier step that
    verifies ((step, path)), and the notices: the warning naming the file, the logs trimmed to it."""
    from rlctl.checkpoint.manager import CheckpointManager
    from rlctl.controller.metrics_log import truncate_logs

    who, _, detail = bad.message.partition(": checkpoint ")
    reason = f"{detail.replace(' is broken: ', ' is broken (', 1)}), found by {who} as it loaded it"
    point = CheckpointManager.for_run(run_dir, keep_last).newest_valid_below(step, reason, hashes=True,
                                                                            content_of=checked_here)
    dropped = truncate_logs(run_dir, point.step)
    return (point.step, point.path), [point.warning, f"resuming from checkpoint step {point.step}" +
                                      (f" ({dropped} log rows after it dropped)" if dropped else "")]


def _current_fingerprint(loaded) -> dict:
    from rlctl.checkpoint.compat import run_fingerprint
    from rlctl.config.loader import config_to_dict
    from rlctl.controller.paths import resolve_paths

    config = resolve_paths(loaded.config, loaded.base_dir)
    return run_fingerprint(config_to_dict(config), loaded.base_dir, config.model.path)


def restore(session: RunSession, ckpt_path: Path) -> None:
    """Load workers, data position and KL controller (what the session has) from a checkpoint folder."""
    state = json.loads((ckpt_path / STATE_FILE).read_text())
    for name, role in session.roles.items():
        role.load_checkpoint(str(ckpt_path / name))
    for name, part in session.stateful.items():
        part.load_state_dict(state[name])
    session.state.step = session.state.saved_step = int(state["step"])
    session.state.best = restore_best(session, state.get("best"))
    for extra in session.extras:
        extra.restore(ckpt_path)


def restore_best(session: RunSession, record: dict | None) -> dict | None:
    """The best-checkpoint record as of the checkpoint resumed from, written back to BEST.json (which
    a run that went further, before `resume --step`, may have moved on). Dropped, and BEST.json with
    it, when run.best_metric / best_mode changed or the checkpoint it names no longer exists."""
    run = session.config.run
    kept = (record is not None and record.get("metric") == run.best_metric and record.get("mode") == run.best_mode
            and (session.checkpoints.step_dir(record["step"]) / MANIFEST).is_file())
    session.checkpoints.write_best(record if kept else None)
    return record if kept else None
