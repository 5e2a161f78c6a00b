"""Config checks of the data files (the machine pass): they exist, and their rows give the plan's
steps per epoch. Also reads the data_source values of the validation files, which decide the
per-source metric names run.best_metric may take.

Checks keep the contract of rlctl.config.checks: `check(config, ctx) -> list[Problem]`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rlctl.config.checks import CheckContext, resolve_path
from rlctl.config.loader import Problem
from rlctl.config.schema import Config


def check_data_files(c: Config, ctx: CheckContext) -> list[Problem]:
    problems = []
    for key in ("train_files", "val_files"):
        for p in getattr(c.data, key):
            path = resolve_path(ctx.base_dir, p)
            if not path.is_file():
                problems.append(Problem(f"data.{key}", f"{p} does not exist (looked in {path.parent}); "
                                                       "create it with `rlctl data prep ...`"))
    return problems


def plan_with_rows(c: Config, ctx: CheckContext, plan):
    """The plan (BatchPlan or SFTPlan) with the training rows, steps per epoch and total steps
    filled in, and the problem of a batch larger than the data; unchanged when a file is unreadable."""
    rows = train_rows(c, ctx.base_dir)
    if not rows:
        return [], plan
    steps = rows // c.data.batch_size
    problems = []
    if steps == 0:
        problems.append(Problem("data.batch_size", f"{c.data.batch_size} prompts per step but only {rows} "
                                                   "training rows"))
    total = c.run.total_steps or steps * c.run.total_epochs
    return problems, dataclasses.replace(plan, train_rows=rows, steps_per_epoch=steps, total_steps=total)


def train_rows(c: Config, base: Path) -> int | None:
    """Rows of all data.train_files; None when one cannot be read."""
    try:
        import pyarrow.parquet as pq

        return sum(pq.ParquetFile(resolve_path(base, p)).metadata.num_rows for p in c.data.train_files)
    except Exception:
        return None  # a broken file is reported by `rlctl data inspect` / at train start


def val_data_sources(c: Config, base: Path) -> frozenset | None:
    """The data_source values of data.val_files; None when a file cannot be read."""
    try:
        import pyarrow.parquet as pq

        return frozenset(ds for p in c.data.val_files
                         for ds in pq.read_table(resolve_path(base, p), columns=["data_source"])
                         .column("data_source").to_pylist())
    except Exception:
        return None   # a missing or broken file is reported by check_data_files / `rlctl data inspect`
