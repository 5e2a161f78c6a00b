"""The framework examples' rlctl.toml files validate as shipped (no errors, a plan with sequences), the
langgraph one being the run docs/benchmarks.md measured learning on SmolLM2 (its model and template)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.config.loader import load_config
from rlctl.validate import validate

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "agents" / "frameworks"


@pytest.mark.parametrize("folder", ["langgraph", "openai-agents", "pydantic-ai", "smolagents"])
def test_a_framework_example_validates(folder):
    loaded = load_config(EXAMPLES / folder / "rlctl.toml")
    problems, plan = validate(loaded, machine=False)
    assert [f"{p.key}: {p.message}" for p in problems if p.severity == "error"] == []
    assert plan.sequences_per_step > 0
    config = loaded.config
    assert config.rollout.agent.command[-1] == "agent.py" and config.model.chat_template == "smollm2-tools.jinja"
