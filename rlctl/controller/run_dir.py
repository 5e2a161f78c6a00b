"""The run folder (docs/architecture.md, "The run folder"): creation and refusal to clobber; its layout and run.json
are rlctl.checkpoint.run_folder's.

`rlctl train` never starts over in a folder that holds checkpoints (that is `rlctl resume`'s
job) and never deletes a user's files: `--force` moves an old folder aside.
"""

from __future__ import annotations

import time
from pathlib import Path

from rlctl.checkpoint.manager import CheckpointManager
from rlctl.checkpoint.run_folder import CONFIG_FILE
from rlctl.errors import UsageError
from rlctl.utils.atomic_files import atomic_write_text


def run_dir_of(config, base_dir: Path) -> Path:
    out = Path(config.run.output_dir).expanduser()
    return (out if out.is_absolute() else base_dir / out) / config.run.name


def claim_new_run_dir(run_dir: Path, *, force: bool) -> Path | None:
    """Make sure `run_dir` can hold a new run; returns where an old folder was moved, if any."""
    if not run_dir.exists() or not any(run_dir.iterdir()):
        run_dir.mkdir(parents=True, exist_ok=True)
        return None
    if CheckpointManager.for_run(run_dir).has_checkpoints():
        raise UsageError(f"run folder {run_dir} already has checkpoints",
                         hint=f"continue it with `rlctl resume {run_dir}`, or set run.name=NEW to start another run.")
    if not force:
        raise UsageError(f"run folder {run_dir} already exists (a run that stopped before its first checkpoint)",
                         hint="pass --force to move it aside and start over, or set run.name=NEW.")
    moved = run_dir.with_name(f"{run_dir.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.rename(moved)
    run_dir.mkdir(parents=True)
    return moved


def write_resolved_config(run_dir: Path, config_dict: dict) -> None:
    import tomlkit

    atomic_write_text(run_dir / CONFIG_FILE, tomlkit.dumps(config_dict))
