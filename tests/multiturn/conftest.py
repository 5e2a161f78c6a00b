"""Fixtures for multi-turn training runs: a tool-calling tiny model, chat data (ray_cluster: tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tool_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The session's tiny model after 100 steps on one calculator transcript (tests/multiturn/tool_model.py)."""
    from tool_model import train_tool_caller

    return train_tool_caller(tiny_model_dir, tmp_path_factory.mktemp("tool_caller") / "model")
