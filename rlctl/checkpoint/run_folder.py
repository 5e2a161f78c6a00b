"""The run folder: its layout, what makes a folder one, run.json, the newest run, and a run as a model.

    <output_dir>/<run.name>/
        config.resolved.toml   the run's config, paths absolute (written first, before Ray starts)
        run.json               the run's identity card (below)
        metrics.jsonl          one row per step;   samples.jsonl   a few samples per step
        rollouts/step_<N>.jsonl   every sample of a step (run.log_rollouts)
        checkpoints/           rlctl.checkpoint.manager's: step_<N>/, LATEST, BEST.json
        hf/step_<N>/           the run used as model.path: its checkpoint step_<N> merged (run_model)

A run folder is one `rlctl train` wrote: it holds run.json, metrics.jsonl or checkpoints/, and
no config.json (a folder with config.json is a Hugging Face model, e.g. a merged export).

run.json (written atomically by the trainer; every field is always present):
    name            run.name
    status          "running" | "finished" | "failed" | "interrupted"
    step            last completed step;   total_steps   steps the run will take
    created_at      first start (UTC, ISO 8601);  started_at  start of this session (train or resume)
    updated_at      last write;  finished_at  when the session ended (null while running)
    exit_code       the process exit code once ended (0, 5, 130...);  error   the one-line message or null
    command         "train" | "resume";  resumed_from  the checkpoint step this session resumed from, or null
    pid, host       the controller process, so `status` can tell a live run from one that died
    rlctl_version   the rlctl that wrote it
`status` reports "died" for a run whose run.json says running but whose pid is gone on this host.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from rlctl import __version__
from rlctl.checkpoint.manager import CHECKPOINTS_DIR, CheckpointManager
from rlctl.checkpoint.manifest import CONFIG_FILE
from rlctl.errors import UsageError

if TYPE_CHECKING:
    from rlctl.models.hub import ModelSource

__all__ = ["CHECKPOINTS_DIR", "CONFIG_FILE"]   # the checkpoint manager's and the manifest's names, shown here

RUN_FILE = "run.json"
METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
ROLLOUTS_DIR = "rollouts"
EXPORTS_DIR = "hf"                 # <run>/hf/step_<N>: the run's checkpoint as a model (run_model)
MODEL_CONFIG = "config.json"       # what makes a folder a Hugging Face model
STATES = ("running", "finished", "failed", "interrupted")


def is_run_folder(path: str | os.PathLike) -> bool:
    """A folder `rlctl train` wrote (run.json, metrics.jsonl or checkpoints/), not a model folder."""
    path = Path(path)
    if (path / MODEL_CONFIG).is_file():
        return False
    return (path / RUN_FILE).is_file() or (path / METRICS_FILE).is_file() or (path / CHECKPOINTS_DIR).is_dir()


def named_run_folder(spec: str, base: Path) -> Path | None:
    """The run folder a model.path names (relative to `base`, the config's folder), or None when it
    names a model folder or a hub id: the one test `train`, `resume` and `config validate` share."""
    from rlctl.models.hub import looks_local

    folder = Path(spec).expanduser()
    folder = folder if folder.is_absolute() else base / folder
    if spec and looks_local(spec, base) and folder.is_dir() and is_run_folder(folder):
        return folder
    return None


def start_run(run_dir: str | os.PathLike, *, name: str, total_steps: int, command: str = "train",
              resumed_from: int | None = None, restarts: int = 0) -> dict:
    """Mark the run as running in this process (a fresh run, or a resume keeping `created_at`);
    `restarts`: the automatic restarts after lost workers so far (run.max_restarts)."""
    old = read_run_info(run_dir)
    now = _now()
    return write_run_info(run_dir, name=name, status="running", step=resumed_from or 0, total_steps=int(total_steps),
                          created_at=old.get("created_at") or now, started_at=now, finished_at=None,
                          exit_code=None, error=None, command=command, resumed_from=resumed_from,
                          pid=os.getpid(), host=socket.gethostname(), rlctl_version=__version__,
                          restarts=int(restarts))


def finish_run(run_dir: str | os.PathLike, *, status: str, exit_code: int, error: str | None = None) -> dict:
    """Record how the session ended: status finished / failed / interrupted and the exit code."""
    if status not in STATES[1:]:
        raise ValueError(f"finish_run status {status!r} is not one of {STATES[1:]}")
    return write_run_info(run_dir, status=status, exit_code=int(exit_code), error=error, finished_at=_now())


def write_run_info(run_dir: str | os.PathLike, **fields) -> dict:
    """Merge `fields` into run.json (e.g. `step=12` after each step) and write it atomically; never
    into a folder that replaced the one this process locked (rlctl.checkpoint.run_lock)."""
    from rlctl.checkpoint.run_lock import check_run_folder
    from rlctl.utils.atomic_files import atomic_write_text

    check_run_folder(run_dir)
    info = {**read_run_info(run_dir), **fields, "updated_at": _now()}
    atomic_write_text(Path(run_dir) / RUN_FILE, json.dumps(info, indent=2) + "\n")
    return info


def read_run_info(run_dir: str | os.PathLike) -> dict:
    path = Path(run_dir) / RUN_FILE
    try:
        info = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return info if isinstance(info, dict) else {}


def find_run_dir(path: str | os.PathLike | None = None, command: str = "status") -> Path:
    """`path` itself when it is a run folder, else the most recently updated run below it
    (`path/*`, `path/runs/*`); UsageError (exit 2) when there is none (`command` names the
    rlctl command the hint shows)."""
    root = Path(path or ".")
    if is_run_folder(root):
        return root
    if (root / CONFIG_FILE).is_file():   # a start that failed before run.json: nothing to continue
        raise UsageError(f"{root} holds a run that failed while starting, before its first step",
                         hint="fix what its `rlctl train` said and run `rlctl train` again (no --force needed)")
    candidates = [p for pattern in ("*", "runs/*", "*/*") for p in root.glob(pattern) if is_run_folder(p)]
    if not candidates:
        raise UsageError(f"no run folder in {root} (a run folder has run.json or metrics.jsonl)",
                         hint=f"pass the run folder: rlctl {command} runs/<name>.")
    return max(candidates, key=lambda p: _mtime(p / RUN_FILE) or _mtime(p / METRICS_FILE))


def run_model(run_dir: str | os.PathLike) -> Path:
    """An rlctl run folder used as model.path: its newest valid checkpoint as a verified HF folder at
    <run>/hf/step_<N>, merged once (LoRA merged in) and reused by later runs."""
    from rlctl.checkpoint.merge import merge_run, pick_checkpoint

    run_dir = Path(run_dir).resolve()
    step = CheckpointManager.for_run(run_dir).latest_named()
    if step is None:   # no readable LATEST: pick_checkpoint raises and says why
        step = pick_checkpoint(run_dir, None)[0].step
    out = run_dir / EXPORTS_DIR / f"step_{step}"
    if not (out / MODEL_CONFIG).is_file():   # merged before: reused without hashing the checkpoint again
        merge_run(run_dir, out, force=out.exists())   # exactly the step LATEST names; raises when it is broken
    return out


def model_of_run(run_dir: str | os.PathLike) -> ModelSource:
    """What model.path = a run folder names, without merging (`rlctl config validate`): the export
    of its newest checkpoint when run_model merged it before, else no folder yet and a note saying
    when it will be; DataError when the run has no checkpoint."""
    from rlctl.errors import DataError
    from rlctl.models.hub import ModelSource

    run_dir = Path(run_dir).resolve()
    step = CheckpointManager.for_run(run_dir).latest_named()
    if step is None:
        raise DataError(f"model.path {run_dir} is an rlctl run folder without a checkpoint",
                        hint="train it first (`rlctl train` / `rlctl resume`), or point model.path at a model folder")
    export = run_dir / EXPORTS_DIR / f"step_{step}"
    if (export / MODEL_CONFIG).is_file():
        return ModelSource(str(export), export, "run")
    return ModelSource(str(run_dir), None, "run",
                       note=f"{run_dir.name} is an rlctl run folder: training starts from its checkpoint step_{step}, "
                            f"merged into {export} when the run starts")


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
