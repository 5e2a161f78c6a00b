"""The run folder (docs/architecture.md, "The run folder"): creation and refusal to clobber; its layout and run.json
are rlctl.checkpoint.run_folder's.

`rlctl train` never starts over in a folder that holds checkpoints (that is `rlctl resume`'s
job) and never deletes a user's files: `--force` moves an old folder aside. Only a failed start's
own files (run.json, an empty metrics.jsonl, the resolved config) are cleared for a retry. The
folder is locked (rlctl.checkpoint.run_lock) before anything in it is read or written.
"""

from __future__ import annotations

import time
from pathlib import Path

from rlctl.checkpoint.manager import CheckpointManager
from rlctl.checkpoint.run_folder import CONFIG_FILE, METRICS_FILE, ROLLOUTS_DIR, RUN_FILE, SAMPLES_FILE, read_run_info
from rlctl.checkpoint.run_lock import RunLock
from rlctl.errors import UsageError
from rlctl.utils.atomic_files import atomic_write_text


def run_dir_of(config, base_dir: Path) -> Path:
    out = Path(config.run.output_dir).expanduser()
    return (out if out.is_absolute() else base_dir / out) / config.run.name


def claim_new_run_dir(run_dir: Path, *, force: bool) -> tuple[RunLock, list[str]]:
    """Lock `run_dir` (created if need be) for a new run; returns the lock and notices to print.

    A folder holding only a failed start (no step logged, no checkpoint: a bad data column, a broken
    reward.py, a stop while the workers started) is cleared of rlctl's files and reused, so a retry
    needs no --force. A folder another process holds is refused (one writer per run folder)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = RunLock.acquire(run_dir, "train")
    try:
        notices, moved = _make_room(run_dir, force=force)
    except BaseException:
        lock.release()
        raise
    if moved:   # the lock went with the old folder: lock the new one
        lock.release()
        lock = RunLock.acquire(run_dir, "train")
    return lock, notices


def _make_room(run_dir: Path, *, force: bool) -> tuple[list[str], bool]:
    if not any(run_dir.iterdir()):
        return [], False
    if CheckpointManager.for_run(run_dir).has_checkpoints():
        raise UsageError(f"run folder {run_dir} already has checkpoints",
                         hint=f"continue it with `rlctl resume {run_dir}`, or set run.name=NEW to start another run.")
    if _never_stepped(run_dir):
        status = read_run_info(run_dir).get("status", "no record")
        status = "its process died" if status == "running" else status   # we hold the lock: nobody runs it
        for name in (RUN_FILE, METRICS_FILE, SAMPLES_FILE, CONFIG_FILE):
            (run_dir / name).unlink(missing_ok=True)
        return [f"starting over in {run_dir}: its last start ended before step 1 ({status})"], False
    if not force:
        raise UsageError(f"run folder {run_dir} already exists (a run that stopped before its first checkpoint)",
                         hint="pass --force to move it aside and start over, or set run.name=NEW.")
    moved = run_dir.with_name(f"{run_dir.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.rename(moved)
    run_dir.mkdir(parents=True)
    return [f"moved the old {run_dir.name} aside to {moved}"], True


def _never_stepped(run_dir: Path) -> bool:
    """No step was logged and no rollout saved: nothing in the folder is worth keeping."""
    metrics = run_dir / METRICS_FILE
    if metrics.is_file() and metrics.stat().st_size > 0:
        return False
    if (run_dir / ROLLOUTS_DIR).exists():
        return False
    return int(read_run_info(run_dir).get("step") or 0) == 0


def write_resolved_config(run_dir: Path, config_dict: dict) -> None:
    import tomlkit

    atomic_write_text(run_dir / CONFIG_FILE, tomlkit.dumps(config_dict))
