"""Each recipe's header says how to run it on CPU; those overrides must give a valid config."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlctl.config.loader import load_config
from rlctl.validate import validate

ROOT = Path(__file__).resolve().parents[2]
WITH_SMOKE_RUN = sorted(p for p in (ROOT / "recipes").glob("*.toml") if "For a CPU smoke run" in p.read_text())


def smoke_overrides(recipe: Path) -> list[str]:
    """The `key=value` words of the commented `rlctl train ...` command (with its continuation lines)."""
    header = recipe.read_text().split("For a CPU smoke run", 1)[1]
    command = re.search(r"rlctl train (.*?)(?:\n(?!#     )|\Z)", header, re.S).group(1)
    words = command.replace("\\", " ").replace("#", " ").split()
    return [w for w in words if "=" in w]


def test_every_gsm8k_recipe_documents_a_cpu_smoke_run():
    assert {p.stem for p in WITH_SMOKE_RUN} >= {"ppo-gsm8k", "grpo-gsm8k", "dapo-gsm8k", "rloo-gsm8k",
                                                "remax-gsm8k", "reinforce-pp-gsm8k"}


@pytest.mark.parametrize("recipe", WITH_SMOKE_RUN, ids=lambda p: p.stem)
def test_cpu_smoke_run_validates(recipe):
    overrides = smoke_overrides(recipe)
    assert "resources.gpus_per_node=0" in overrides and "model.path=models/tiny" in overrides
    problems, plan = validate(load_config(recipe, overrides), machine=False)
    assert [f"{p.key}: {p.message}" for p in problems if p.severity == "error"] == []
    assert plan.sequences_per_step > 0
