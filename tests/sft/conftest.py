"""Fixtures for SFT runs in this process: arith SFT data, projects (ray_cluster: tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.project import write_project
from rlctl.tasks.prep import PrepOptions, prepare


@pytest.fixture(scope="module")
def arith_sft_data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("arith-sft")
    prepare("arith", PrepOptions(out=root, sft=True))
    return root


@pytest.fixture(scope="module")
def sft_project(tiny_model_dir, arith_sft_data):
    """sft_project(folder, recipe="sft-arith-cpu", model=tiny): a project with data/arith-sft (SFT
    data; its RL columns also serve GRPO recipes, linked as data/arith too). Module-scoped, so the
    module's run fixtures make their projects with it too."""
    def make(folder: Path, recipe: str = "sft-arith-cpu", model: Path | None = None) -> Path:
        write_project(folder, recipe, str(model or tiny_model_dir))
        (folder / "data").mkdir()
        (folder / "data" / "arith-sft").symlink_to(arith_sft_data)
        (folder / "data" / "arith").symlink_to(arith_sft_data)
        return folder

    return make
