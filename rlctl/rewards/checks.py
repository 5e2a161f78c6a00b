"""Config checks of [reward]: each source's own settings (from its registry entry), the weights,
overlong shaping, and in the machine pass the reward model folder and the reward function's file.

Checks keep the contract of rlctl.config.checks: `check(config, ctx) -> list[Problem]`.
"""

from __future__ import annotations

from pathlib import Path

from rlctl.config.checks import CheckContext, resolve_path
from rlctl.config.loader import Problem
from rlctl.config.schema import Config
from rlctl.rewards.registry import SOURCES, by_name, is_configured


def check_reward(c: Config, ctx: CheckContext) -> list[Problem]:
    """Every source's settings (a judge's model, prompt and score rule; the http(s) URLs, and with
    ctx.reach_services something answers at each), then reward.weights names configured sources.
    Reported in the order of their keys, so it does not depend on the order of the sources."""
    r, problems = c.reward, []
    for entry in SOURCES:
        if entry.check is not None:
            problems += entry.check(r, ctx.reach_services)
    for name in r.weights:
        entry = by_name(name)
        if entry is not None and not is_configured(entry, r):
            problems.append(Problem("reward.weights", f"weights {name!r}, a source that is not configured "
                                                      f"(set reward.{entry.key})"))
    return sorted(problems, key=lambda p: p.key)


def check_overlong(c: Config, ctx: CheckContext) -> list[Problem]:
    overlong = c.reward.overlong
    if overlong.enable and overlong.buffer_len > c.data.max_response_length:
        return [Problem("reward.overlong.buffer_len", f"{overlong.buffer_len} is longer than "
                                                      f"data.max_response_length = {c.data.max_response_length}")]
    return []


def check_reward_model(c: Config, ctx: CheckContext) -> list[Problem]:
    """reward.model written as a path (./, /, ~) must exist; anything else may be a hub id."""
    model = c.reward.model
    if not model:
        return []
    path = resolve_path(ctx.base_dir, model)
    if model.startswith((".", "/", "~")) and not path.is_dir():
        return [Problem("reward.model", f"{path} is not a folder; make one with `rlctl model tiny OUT --reward-model` "
                                        "or point at a sequence-classification model")]
    return []


def builtin_reward_names() -> tuple[str, ...]:
    """The names reward.function may take instead of "file.py:function"."""
    from rlctl.rewards.builtin import BUILTINS

    return tuple(BUILTINS)


def check_reward_function(c: Config, ctx: CheckContext) -> list[Problem]:
    """reward.function is a built-in's name or "file.py:function" whose file exists."""
    function, base = c.reward.function, ctx.base_dir
    builtins = builtin_reward_names()
    if not function or function in builtins:
        return []
    file, _, fn = function.rpartition(":")
    if not file or not fn:
        return [Problem("reward.function", f"{function!r} is neither \"file.py:function\" "
                                           f"nor a built-in ({', '.join(builtins)})")]
    if not resolve_path(Path(base), file).is_file():
        return [Problem("reward.function", f"{file} does not exist (relative to {base})")]
    return _loads(function, Path(base))


def _loads(function: str, base: Path) -> list[Problem]:
    """Import the file and find the function now, as the reward workers will: a syntax error or a
    missing function is found before Ray starts, not after the workers' start-up."""
    from rlctl.errors import ConfigError
    from rlctl.rewards.custom import load_reward_fn, parse_spec

    try:
        load_reward_fn(parse_spec(function, base))
    except ConfigError as e:
        return [Problem("reward.function", e.message if e.hint is None else f"{e.message}; {e.hint}")]
    return []
