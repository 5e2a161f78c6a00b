"""The multi-turn recipes and example validate as shipped (no errors; the CPU tool-use pair chains)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.config.loader import load_config
from rlctl.validate import validate

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("path", ["recipes/sft-calc-tools-cpu.toml", "recipes/grpo-calc-tools-cpu.toml",
                                  "examples/multiturn-feedback/rlctl.toml", "examples/vision-zoom/rlctl.toml"])
def test_ships_valid(path):
    loaded = load_config(ROOT / path)
    problems, plan = validate(loaded, machine=False)
    assert [f"{p.key}: {p.message}" for p in problems if p.severity == "error"] == []
    assert plan.sequences_per_step > 0


def test_tool_use_recipes_chain():
    sft = load_config(ROOT / "recipes/sft-calc-tools-cpu.toml").config
    rl = load_config(ROOT / "recipes/grpo-calc-tools-cpu.toml").config
    assert rl.model.path == f"{sft.run.output_dir}/{sft.run.name}"
    assert rl.data.train_files == sft.data.train_files and rl.rollout.multi_turn.tools == ("calculator",)
