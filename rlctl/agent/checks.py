"""Config checks of [rollout.agent]: one kind of agent, what agent rollouts are not built with yet, and
in the machine pass the function imported (async, two parameters) or the command's program found.

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
    problems += [Problem(key, f"{what} is not built with agent programs yet; {fix}")
                 for key, what, fix in _not_built(c)]
    if problems or not ctx.machine:
        return problems
    return _load_problems(c, ctx.base_dir)


def _not_built(c: Config) -> list[tuple[str, str, str]]:
    from rlctl import algorithms

    out = []
    if c.rollout.multi_turn.enable:
        out.append(("rollout.multi_turn.enable", "rlctl's own turn loop",
                    "the agent runs its own loop: set rollout.multi_turn.enable = false"))
    if c.rollout.mode != "sync":
        out.append(("rollout.mode", f"rollout.mode = {c.rollout.mode!r}", "use rollout.mode = \"sync\""))
    if c.algorithm.use_pf_ppo:
        out.append(("algorithm.use_pf_ppo", "PF-PPO (it resamples a group's rows, and an episode may be several)",
                    "set algorithm.use_pf_ppo = false"))
    try:
        needs = algorithms.run_needs(c)
    except Exception:   # an unknown name is check_registered's to report
        return out
    if needs.greedy_baseline or needs.real_response:
        out.append(("algorithm.name", f"{c.algorithm.name!r} (its baseline or reference rows pair one to one with "
                    "the prompts)", "use grpo, rloo, reinforce_plus_plus or gae"))
    return out


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
