"""Interactions: the simulated user or environment that answers an assistant turn without a tool call.

`[rollout.multi_turn] interaction = "file.py:name"` names either
  * a function `(messages, extra_info) -> {"content": str, "done": bool, "score": float}` (sync or
    async; "score" optional): "content" becomes the next user message unless "done"; or
  * a verl BaseInteraction-style class or object, used unchanged: per sample
    `start_interaction(instance_id, **interaction_kwargs)`, then after each such turn
    `generate_response(instance_id, messages, **interaction_kwargs)` -> (should_terminate, content,
    score, metadata), and `finalize_interaction(instance_id)` when the conversation ends. Its
    kwargs are the row's `extra_info.interaction_kwargs`, as in verl.
"""

from __future__ import annotations

import copy
import inspect
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlctl.errors import ConfigError
from rlctl.multiturn.tools import load_object, maybe_await

KEY = "rollout.multi_turn.interaction"


@dataclass
class Reply:
    content: str
    done: bool
    score: float | None = None


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
        return Reply(str(out.get("content") or ""), bool(out.get("done", False)),
                     None if score is None else float(score))

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


def load_interaction(spec: str, base: Path):
    """`file.py:name` -> FunctionInteraction or VerlInteraction (ConfigError, exit 2, otherwise)."""
    obj = load_object(spec, base, KEY)
    if inspect.isclass(obj):
        try:
            obj = obj({"name": getattr(obj, "__name__", "interaction")})   # verl: __init__(self, config: dict)
        except Exception as e:
            raise ConfigError(f"{KEY}: {spec}: could not create the interaction: {type(e).__name__}: {e}",
                              hint="verl interactions take one config dict; or name an instance in your file") from e
    if hasattr(obj, "generate_response"):
        return VerlInteraction(obj)
    if callable(obj):
        return FunctionInteraction(obj)
    raise ConfigError(f"{KEY}: {spec} is neither a function nor an interaction object (with generate_response)")
