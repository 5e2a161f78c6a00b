"""Config checks of [rollout.multi_turn]: the tool and interaction names, and in the machine pass
each one imported (with its schema derived) and every data row's interaction name.

Checks keep the contract of rlctl.config.checks: `check(config, ctx) -> list[Problem]`.
"""

from __future__ import annotations

from rlctl.config.checks import CheckContext, resolve_path
from rlctl.config.loader import Problem
from rlctl.config.schema import Config
from rlctl.multiturn.builtin_tools import BUILTINS


def check_multi_turn(c: Config, ctx: CheckContext) -> list[Problem]:
    """Names of tools and the interaction; in the machine pass each is imported, and each tool's
    schema derived, so a bad file:name or a tool without type hints is reported here, not mid-run."""
    mt, problems = c.rollout.multi_turn, []
    if not mt.enable:
        return problems
    for spec in mt.tools:
        if spec not in BUILTINS and ":" not in spec:
            problems.append(Problem("rollout.multi_turn.tools", f"unknown tool {spec!r}: use a built-in "
                                    f"({', '.join(BUILTINS)}) or \"file.py:name\""))
    if mt.interaction and ":" not in mt.interaction:
        problems.append(Problem("rollout.multi_turn.interaction", f"{mt.interaction!r} is not \"file.py:name\""))
    if not mt.tools and not mt.interaction:
        problems.append(Problem("rollout.multi_turn.enable", "multi-turn rollouts without tools or an interaction "
                                "stop after one turn; list tools or set an interaction", severity="warning"))
    if problems or not ctx.machine:
        return problems
    return _load_problems(c, ctx)


def _load_problems(c: Config, ctx: CheckContext) -> list[Problem]:
    from rlctl.errors import ConfigError
    from rlctl.multiturn.interactions import load_interaction
    from rlctl.multiturn.tools import load_tools

    mt, base, problems = c.rollout.multi_turn, ctx.base_dir, []
    loaders = (("rollout.multi_turn.tools", lambda: load_tools(mt.tools, base)),
               ("rollout.multi_turn.interaction", lambda: mt.interaction and load_interaction(mt.interaction, base)))
    loaded = {}
    for key, load in loaders:
        try:
            loaded[key] = load()
        except ConfigError as e:
            message = e.message.removeprefix(key + ": ")
            problems.append(Problem(key, message + (f"; {e.hint}" if e.hint else "")))
    return problems + check_interaction_names(c, ctx, loaded.get("rollout.multi_turn.interaction"))


def check_interaction_names(c: Config, ctx: CheckContext, interaction) -> list[Problem]:
    """Several interactions by name: every row of the data files must pick one of them
    (extra_info.interaction_kwargs.name). Files that cannot be read are the data check's to report."""
    from rlctl.multiturn.interactions import InteractionSet

    if not isinstance(interaction, InteractionSet):
        return []
    import pyarrow.parquet as pq

    problems = []
    for key in ("train_files", "val_files"):
        for p in getattr(c.data, key):
            try:
                infos = pq.read_table(resolve_path(ctx.base_dir, p), columns=["extra_info"]).column(
                    "extra_info").to_pylist()
            except Exception:
                continue
            names = [interaction.name_of(info) for info in infos]
            bad = sorted({str(n) for n in names if n not in interaction.members})
            if bad:
                count = sum(n not in interaction.members for n in names)
                problems.append(Problem(f"data.{key}", f"{p}: {count} row(s) pick no interaction of "
                                        f"rollout.multi_turn.interaction (extra_info.interaction_kwargs.name: "
                                        f"{', '.join(bad)}); it has {', '.join(interaction.members)}"))
    return problems
