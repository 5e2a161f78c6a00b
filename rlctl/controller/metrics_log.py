"""Metric sinks of a run: metrics.jsonl and samples.jsonl in the run folder, plus TensorBoard / W&B.

`run.loggers` picks the sinks: "jsonl" (metrics.jsonl + samples.jsonl, what `rlctl status` and
`--plot` read), "tensorboard" (event files in <run_dir>/tensorboard), "wandb" (a W&B run that
resume continues), and "console" (the live display, not handled here). Files are opened in append
mode and flushed every step, so a crash loses at most the step being written and a resumed run
continues the same files; `truncate_logs` first drops rows past the checkpoint's step.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import secrets
from pathlib import Path
from typing import Any, Iterable

from rlctl.checkpoint.run_folder import METRICS_FILE, SAMPLES_FILE
from rlctl.errors import UsageError

SINKS = ("console", "jsonl", "tensorboard", "wandb")
TENSORBOARD_DIR = "tensorboard"
WANDB_ID_FILE = "wandb_id"
_PACKAGES = {"tensorboard": "tensorboard", "wandb": "wandb"}


class MetricsLogger:
    """Write one row of metrics per step (and a few samples) to every configured sink.

    `start_step` is the step a resumed run starts after: TensorBoard hides its own events past it.
    """

    def __init__(self, run_dir: str | os.PathLike, loggers: Iterable[str], run_name: str,
                 config_dict: dict, *, start_step: int = 0):
        self.run_dir = Path(run_dir)
        self.loggers = tuple(loggers)
        _check_sinks(self.loggers)  # before anything is created: a missing package is exit 2
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self._metrics = self._samples = self._tb = self._wandb = None
        self.every_row: dict[str, float] = {}   # added to each step's row (run/restarts with run.max_restarts)
        if "jsonl" in self.loggers:
            self._metrics = open(self.run_dir / METRICS_FILE, "a", encoding="utf-8")
            self._samples = open(self.run_dir / SAMPLES_FILE, "a", encoding="utf-8")
        if "tensorboard" in self.loggers:
            self._tb = _open_tensorboard(self.run_dir, config_dict, start_step)
        if "wandb" in self.loggers:
            self._wandb = _open_wandb(self.run_dir, run_name, config_dict)

    def __enter__(self) -> MetricsLogger:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def log(self, step: int, metrics: dict[str, Any]) -> dict[str, float | int | None]:
        """Write `{"step": step, **metrics}`; returns the row as written (non-finite -> None)."""
        row = {"step": int(step)}
        row.update({key: _number(key, value) for key, value in {**metrics, **self.every_row}.items() if key != "step"})
        if self._metrics is not None:
            self._metrics.write(json.dumps(row) + "\n")
            self._metrics.flush()
        numbers = {k: v for k, v in row.items() if k != "step" and v is not None}
        if self._tb is not None:
            for key, value in numbers.items():
                self._tb.add_scalar(key, value, global_step=row["step"])
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(numbers, step=row["step"])
        return row

    def log_samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        """One line per sample in samples.jsonl: `{"step": step, **row}` (prompt, response, reward...)."""
        if self._samples is None or not rows:
            return
        for row in rows:
            self._samples.write(json.dumps({"step": int(step), **_jsonable(row)}, ensure_ascii=False) + "\n")
        self._samples.flush()

    def close(self) -> None:
        for f in (self._metrics, self._samples):
            if f is not None and not f.closed:
                f.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def truncate_logs(run_dir: str | os.PathLike, step: int) -> int:
    """Keep only rows with `step <= step` in metrics.jsonl and samples.jsonl; returns rows dropped.

    Exact resume from a checkpoint at step N: rows the interrupted run wrote past N (and a line
    cut off by a crash) are dropped, so the resumed run's files equal an uninterrupted run's.
    """
    dropped = 0
    for name in (METRICS_FILE, SAMPLES_FILE):
        path = Path(run_dir) / name
        if not path.is_file():
            continue
        lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
        kept = [line for line in lines if _row_step(line) is not None and _row_step(line) <= step]
        dropped += len(lines) - len(kept)
        if len(kept) != len(lines):
            from rlctl.utils.atomic_files import atomic_write_text

            atomic_write_text(path, "".join(line if line.endswith("\n") else line + "\n" for line in kept))
    return dropped


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The rows of a JSONL file; a torn last line (the run was killed mid-write) is skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                rows.append(row)
    return rows


def _row_step(line: str) -> int | None:
    try:
        step = json.loads(line).get("step")
    except (json.JSONDecodeError, AttributeError):
        return None
    return step if isinstance(step, int) else None


def _check_sinks(loggers: tuple[str, ...]) -> None:
    for name in loggers:
        if name not in SINKS:
            raise UsageError(f"run.loggers: unknown logger {name!r}", hint=f"choose from {', '.join(SINKS)}.")
        package = _PACKAGES.get(name)
        if package and importlib.util.find_spec(package) is None:
            raise UsageError(f"run.loggers includes {name!r} but the {package} package is not installed",
                             hint=f'pip install "rlctl[{name}]", or remove "{name}" from run.loggers.')


def _open_tensorboard(run_dir: Path, config_dict: dict, start_step: int):
    from torch.utils.tensorboard import SummaryWriter

    # purge_step: a resumed run hides the events the interrupted run wrote past its checkpoint.
    writer = SummaryWriter(log_dir=str(run_dir / TENSORBOARD_DIR), purge_step=start_step + 1 if start_step else None)
    if not start_step:
        writer.add_text("config", "```\n" + json.dumps(_jsonable(config_dict), indent=2) + "\n```", 0)
    return writer


def _open_wandb(run_dir: Path, run_name: str, config_dict: dict):
    import wandb

    # The W&B run id lives in the run folder, so `rlctl resume` continues the same W&B run.
    id_file = run_dir / WANDB_ID_FILE
    run_id = id_file.read_text().strip() if id_file.is_file() else secrets.token_hex(6)
    id_file.write_text(run_id + "\n")
    return wandb.init(project=os.environ.get("WANDB_PROJECT", "rlctl"), name=run_name, id=run_id,
                      resume="allow", config=_jsonable(config_dict), dir=str(run_dir))


def _number(key: str, value: Any) -> float | int | None:
    """A metric value as a JSON number: bools and integers stay ints, NaN/inf become None."""
    if hasattr(value, "item") and callable(value.item):  # numpy scalars, 0-d arrays and tensors
        value = value.item()
    if isinstance(value, (bool, int)):
        return int(value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    raise TypeError(f"metric {key!r} is {type(value).__name__} ({value!r:.40}); metrics must be numbers")


def _jsonable(value: Any) -> Any:
    """Plain JSON types for a sample row or the config: numpy -> Python, NaN -> None, else str."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "tolist") and callable(value.tolist):  # numpy arrays and scalars
        return _jsonable(value.tolist())
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, (str, int, bool)):
        return value
    return str(value)
