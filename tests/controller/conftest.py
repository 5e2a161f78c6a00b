"""Fixtures for training runs in this process: arith data, projects (ray_cluster: tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.project import write_project
from rlctl.tasks.prep import PrepOptions, prepare


@pytest.fixture(scope="module")
def arith_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("arith")
    prepare("arith", PrepOptions(out=root))
    return root


@pytest.fixture
def make_project(tiny_model_dir, arith_data):
    """make_project(folder, recipe): a project from `recipe` with the tiny model and data/arith."""
    def make(folder: Path, recipe: str) -> Path:
        write_project(folder, recipe, str(tiny_model_dir))
        (folder / "data").mkdir()
        (folder / "data" / "arith").symlink_to(arith_data)
        return folder

    return make
