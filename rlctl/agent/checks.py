"""Config checks of [rollout.agent]: one kind of agent, and in the machine pass the function imported
(async, two parameters) or the command's program found. What agent programs are built with (modes,
algorithms) is their row of the rollout table, checked by rlctl.rollouts.checks.

Checks keep the contract of rlctl.config.checks: `check(config, ctx) -> list[Problem]`.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from rlctl.config.checks import CheckContext
from rlctl.config.loader import Problem
from rlctl.config.schema import Config

KEY = "rollout.agent"


def agent_enabled(c: Config) -> bool:
    return bool(c.rollout.agent.function or c.rollout.agent.command)


def check_agent(c: Config, ctx: CheckContext) -> list[Problem]:
    ag, problems = c.rollout.agent, []
    if not agent_enabled(c):
        return problems
    if ag.function and ag.command:
        problems.append(Problem(f"{KEY}.command", "set rollout.agent.function or rollout.agent.command, not both"))
    if problems or not ctx.machine:
        return problems
    return _load_problems(c, ctx.base_dir)


def _load_problems(c: Config, base: Path) -> list[Problem]:
    from rlctl.errors import ConfigError

    ag = c.rollout.agent
    if ag.function:
        try:
            import openai  # noqa: F401  (the client a function agent gets)
        except ImportError:
            return [Problem(f"{KEY}.function", "a function agent gets an openai.AsyncOpenAI client, and the openai "
                            "package is not installed: pip install openai")]
        from rlctl.agent.runner import load_agent

        try:
            load_agent(ag, base)
        except ConfigError as e:
            return [Problem(f"{KEY}.function", e.message.removeprefix(f"{KEY}.function: ") +
                            (f"; {e.hint}" if e.hint else ""))]
        return []
    program = ag.command[0]
    if not (base / program).is_file() and shutil.which(program) is None:
        return [Problem(f"{KEY}.command", f"{program!r} is neither a file next to rlctl.toml nor a program on PATH")]
    return []
