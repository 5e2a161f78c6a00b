"""Interactions: the simulated user or environment that answers an assistant turn without a tool call.

`[rollout.multi_turn] interaction = "file.py:name"` names either
  * a function `(messages, extra_info) -> {"content": str, "done": bool, "score": float}` (sync or
    async; "score" optional; "images" optional, for a vision-language policy): "content" becomes
    the next user message unless "done"; or
  * a verl BaseInteraction-style class or object, used unchanged: per sample
    `start_interaction(instance_id, **interaction_kwargs)`, then after each such turn
    `generate_response(instance_id, messages, **interaction_kwargs)` -> (should_terminate, content,
    score, metadata), and `finalize_interaction(instance_id)` when the conversation ends. Its
    kwargs are the row's `extra_info.interaction_kwargs`, as in verl; or
  * a dict of them by name, `{"gsm8k": Gsm8kInteraction, "feedback": ask_again}` (verl's
    interaction_config_path, which lists several): each row picks one with
    `extra_info.interaction_kwargs.name`; a class is created with `{"name": <its key>}`.
"""

from __future__ import annotations

import copy
import inspect
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlctl.errors import ConfigError, DataError
from rlctl.multiturn.tools import load_object, maybe_await

KEY = "rollout.multi_turn.interaction"


@dataclass
class Reply:
    content: str
    done: bool
    score: float | None = None
    images: list = field(default_factory=list)   # a function's "images": shown to a vision-language policy


class FunctionInteraction:
    def __init__(self, fn):
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(params) < 2 and not any(p.kind is p.VAR_POSITIONAL for p in inspect.signature(fn).parameters.values()):
            raise ConfigError(f"{KEY}: {fn.__name__} must take (messages, extra_info)",
                              hint="def my_user(messages, extra_info): return {\"content\": ..., \"done\": False}")
        self.fn = fn

    async def start(self, extra_info: dict) -> Any:
        return None

    async def respond(self, state, messages: list, extra_info: dict) -> Reply:
        out = await maybe_await(self.fn(copy.deepcopy(messages), extra_info))
        if not isinstance(out, dict):
            raise TypeError(f"the interaction returned {type(out).__name__}, not a dict with \"content\" and \"done\"")
        score = out.get("score")
        images = out.get("images") or []
        return Reply(str(out.get("content") or ""), bool(out.get("done", False)),
                     None if score is None else float(score), list(images) if isinstance(images, (list, tuple))
                     else [images])

    async def finish(self, state) -> None:
        return None


class VerlInteraction:
    def __init__(self, obj):
        self.obj = obj

    async def start(self, extra_info: dict) -> Any:
        kwargs = dict(extra_info.get("interaction_kwargs") or {})
        instance = await maybe_await(self.obj.start_interaction(uuid.uuid4().hex, **kwargs))
        return instance, kwargs

    async def respond(self, state, messages: list, extra_info: dict) -> Reply:
        instance, kwargs = state
        out = await maybe_await(self.obj.generate_response(instance, copy.deepcopy(messages), **kwargs))
        terminate, content, score = tuple(out)[:3]
        return Reply(str(content or ""), bool(terminate), None if score is None else float(score))

    async def finish(self, state) -> None:
        instance, _ = state
        finalize = getattr(self.obj, "finalize_interaction", None)
        if finalize is None:
            return
        takes_id = any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
                       for p in inspect.signature(finalize).parameters.values())
        await maybe_await(finalize(instance) if takes_id else finalize())


class InteractionSet:
    """Several interactions by name: a row's `extra_info.interaction_kwargs.name` picks its own."""

    def __init__(self, members: dict):
        self.members = members

    @staticmethod
    def name_of(extra_info: dict | None) -> str | None:
        """The interaction a row names (extra_info.interaction_kwargs.name), None when it names none."""
        return ((extra_info or {}).get("interaction_kwargs") or {}).get("name")

    def pick(self, extra_info: dict) -> str:
        name = self.name_of(extra_info)
        if name not in self.members:
            said = "names no interaction" if name is None else f"names interaction {name!r}"
            raise DataError(f"a row's extra_info.interaction_kwargs {said}; {KEY} has "
                            f"{', '.join(map(repr, self.members))}", hint="set interaction_kwargs.name in every row "
                                                                         "to one of them")
        return name

    async def start(self, extra_info: dict) -> Any:
        member = self.members[self.pick(extra_info)]
        return member, await member.start(extra_info)

    async def respond(self, state, messages: list, extra_info: dict) -> Reply:
        member, inner = state
        return await member.respond(inner, messages, extra_info)

    async def finish(self, state) -> None:
        member, inner = state
        await member.finish(inner)


def load_interaction(spec: str, base: Path):
    """`file.py:name` -> FunctionInteraction, VerlInteraction or, for a dict of them by name,
    InteractionSet (ConfigError, exit 2, otherwise)."""
    obj = load_object(spec, base, KEY)
    if isinstance(obj, dict):
        if not obj or not all(isinstance(k, str) and k for k in obj):
            raise ConfigError(f"{KEY}: {spec} is a dict: it must map interaction names (strings) to interactions")
        return InteractionSet({name: _interaction(member, f"{spec}[{name!r}]", name) for name, member in obj.items()})
    return _interaction(obj, spec, getattr(obj, "__name__", "interaction"))


def _interaction(obj, spec: str, name: str):
    if inspect.isclass(obj):
        try:
            obj = obj({"name": name})   # verl: __init__(self, config: dict)
        except Exception as e:
            raise ConfigError(f"{KEY}: {spec}: could not create the interaction: {type(e).__name__}: {e}",
                              hint="verl interactions take one config dict; or name an instance in your file") from e
    if hasattr(obj, "generate_response"):
        return VerlInteraction(obj)
    if callable(obj):
        return FunctionInteraction(obj)
    raise ConfigError(f"{KEY}: {spec} is neither a function nor an interaction object (with generate_response)")
