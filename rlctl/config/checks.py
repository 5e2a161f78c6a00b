"""The contract every cross-field or machine check of a config keeps.

A check is `check(config, ctx) -> list[Problem]`: it reads the type-checked `Config` and the
`CheckContext` below, and returns every problem it finds (errors and warnings), raising nothing.
Each feature keeps its checks beside the code that reads those keys (rlctl.rewards.checks,
rlctl.multiturn.checks, ...); rlctl.validate gathers them for RL and for SFT.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rlctl.config.loader import Problem
from rlctl.config.schema import Config


@dataclass(frozen=True)
class CheckContext:
    base_dir: Path                # relative paths in the config are relative to this folder
    raw: dict                     # the user's own keys (after overrides): "was [critic] written?"
    machine: bool = True          # the second pass: files, model, GPUs, installed packages
    reach_services: bool = False  # connect to the reward URLs (only with `machine`)
    val_data_sources: frozenset | None = None  # data_source values of data.val_files; None: unread


Check = Callable[[Config, CheckContext], "list[Problem]"]


def resolve_path(base: Path, p: str) -> Path:
    """A path from the config: `~` expanded, relative ones under `base`."""
    path = Path(p).expanduser()
    return path if path.is_absolute() else base / path

