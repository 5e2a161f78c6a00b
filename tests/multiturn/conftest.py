"""Fixtures for multi-turn training runs: one Ray instance per module, a tool-calling tiny model, chat data."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def tool_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The session's tiny model after 100 steps on one calculator transcript (tests/multiturn/tool_model.py)."""
    from tool_model import train_tool_caller

    return train_tool_caller(tiny_model_dir, tmp_path_factory.mktemp("tool_caller") / "model")
