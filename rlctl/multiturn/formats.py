"""Tool-call formats: how a model writes a function call in its text, and how to read it back.

`hermes` is Qwen2.5/Qwen3's format (and the tiny model's chat template): each call is a JSON object
`{"name": ..., "arguments": {...}}` inside `<tool_call>` ... `</tool_call>`; the text before the
first call is the message's content. Training rollouts and `rlctl serve` read calls with the same
parser, so a model is scored and served on exactly what it learned to write.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from rlctl.config.schema import TOOL_FORMATS as FORMATS   # one list: the config's choices are the same


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict


@dataclass(frozen=True)
class ParsedTurn:
    """One assistant turn read back: its plain content, the calls it made, and why any block was unreadable."""

    content: str
    calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


_HERMES_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


def parse_tool_calls(text: str, fmt: str = "hermes") -> ParsedTurn:
    """Split an assistant turn into content and tool calls.

    A block that is not a JSON object with a string `name` (and an object or JSON-string
    `arguments`) is not a call: it is reported in `errors`, so a rollout can answer the model
    with what was wrong instead of crashing. An unclosed last block (the model ran out of
    tokens) is read like a closed one if its JSON is complete.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown tool format {fmt!r}; known: {', '.join(FORMATS)}")
    start = text.find("<tool_call>")
    if start < 0:
        return ParsedTurn(content=text)
    calls, errors = [], []
    for block in _HERMES_BLOCK.findall(text, start):
        call, error = _read_call(block.strip())
        if call is not None:
            calls.append(call)
        else:
            errors.append(error)
    return ParsedTurn(content=text[:start].rstrip("\n"), calls=calls, errors=errors)


def _read_call(block: str) -> tuple[ToolCall | None, str]:
    try:
        obj = json.loads(block)
    except json.JSONDecodeError as e:
        return None, f"tool call is not valid JSON ({e.msg} at character {e.pos}): {block[:80]!r}"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None, f'tool call must be {{"name": ..., "arguments": {{...}}}}, got {block[:80]!r}'
    args = obj.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return None, f"arguments of {obj['name']!r} are not a JSON object: {args[:80]!r}"
    if not isinstance(args, dict):
        return None, f"arguments of {obj['name']!r} must be a JSON object, got {type(args).__name__}"
    return ToolCall(obj["name"], args), ""


def format_tool_call(call: ToolCall, fmt: str = "hermes") -> str:
    """The text a model writes for one call (what the chat template renders for an assistant's tool_calls)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown tool format {fmt!r}; known: {', '.join(FORMATS)}")
    return "<tool_call>\n" + json.dumps({"name": call.name, "arguments": call.arguments}) + "\n</tool_call>"


def openai_tool_calls(calls: list[ToolCall], id_prefix: str = "call") -> list[dict]:
    """Calls in the OpenAI chat shape (`tool_calls` of an assistant message), arguments as a JSON string."""
    return [{"id": f"{id_prefix}_{i}", "type": "function",
             "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for i, c in enumerate(calls)]
