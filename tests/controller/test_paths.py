"""resolve_paths: rlctl.toml's relative paths made absolute before the run records its config."""

from __future__ import annotations

import dataclasses
import os
import sys

from rlctl.config.schema import Config
from rlctl.controller.paths import resolve_paths


def test_a_command_keeps_the_link_a_virtual_environment_runs_through(tmp_path):
    """A venv's bin/python is a link to the base interpreter; resolved through the link, the agent ran
    outside its environment (its framework not importable)."""
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    os.symlink(sys.executable, tmp_path / "venv" / "bin" / "python")
    project = tmp_path / "examples" / "agent"
    project.mkdir(parents=True)
    (project / "agent.py").write_text("")
    config = Config()
    config = dataclasses.replace(config, rollout=dataclasses.replace(config.rollout, agent=dataclasses.replace(
        config.rollout.agent, command=("../../venv/bin/python", "agent.py", "--flag"))))
    assert resolve_paths(config, project).rollout.agent.command == (
        str(tmp_path / "venv" / "bin" / "python"), str(project / "agent.py"), "--flag")
