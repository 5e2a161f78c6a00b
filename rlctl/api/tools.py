"""OpenAI tool calling for the built-in engine: check `tools` / `tool_choice` and the tool fields of
messages, and turn a choice's text into `tool_calls` with the parser training uses (hermes).

    request   tools=[{"type": "function", "function": {"name", "description", "parameters"}}]
              tool_choice = "auto" (default) | "none" | "required" (one call of one of the tools) |
              {"type": "function", "function": {"name": N}} (one call of N): a forced choice is decoded
              under a grammar (rlctl.api.constraints), so the answer is a call that parses
    prompt    the chat template renders the tools (`apply_chat_template(messages, tools=...)`), also
              with "none", so the prompt is the same; "none" only turns the parsing off
    answer    a choice that stopped on its own and whose text holds well-formed calls becomes
              {"content": text before the first call or null, "tool_calls": [...]} with
              finish_reason "tool_calls"; a malformed call or a cut-off ("length") turn stays plain content
    stream    content streams until `<tool_call>` starts; the rest is held back and sent, once the
              choice ends, as one `tool_calls` delta per call (OpenAI's chunk shape), or as content
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from rlctl.multiturn.formats import openai_tool_calls, parse_tool_calls
from rlctl.api.api_error import APIError
from rlctl.api.constraints import tool_call_spec

CALL_START = "<tool_call>"
_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@dataclass(frozen=True)
class ToolSpec:
    tools: list[dict]  # as the client sent them, checked: what the template renders
    parse: bool        # tool_choice "auto" or forced: read calls out of the answers
    grammar: str | None = None  # a forced tool_choice: the spec of the call (rlctl.api.constraints)


def _bad(param: str, message: str) -> APIError:
    return APIError(400, message, param=param)


def parse_tools(body: dict) -> ToolSpec | None:
    """The request's tools and tool_choice, checked; None when the request has no tools."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    forced = choice == "required" or isinstance(choice, dict)   # a forced choice is one call: never parallel
    if body.get("parallel_tool_calls") is False and not forced:
        raise _bad("parallel_tool_calls", "'parallel_tool_calls': false is not supported by the built-in "
                                          "engine (it returns every call the model writes); leave it out")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise _bad("tool_choice", "'tool_choice' needs 'tools'; send the tools the model may call")
        return None
    if not isinstance(tools, list):
        raise _bad("tools", f"'tools' must be a list of function tools, got {type(tools).__name__}")
    names = [_check_tool(tool, i) for i, tool in enumerate(tools)]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise _bad("tools", f"'tools' names {', '.join(repeated)} more than once; function names must be unique")
    if choice is None or choice == "auto":
        return ToolSpec(tools, parse=True)
    if choice == "none":
        return ToolSpec(tools, parse=False)
    if choice == "required":   # one call, also with parallel_tool_calls true (the grammar writes one)
        return ToolSpec(tools, parse=True, grammar=tool_call_spec(tools))
    if isinstance(choice, dict):
        return ToolSpec(tools, parse=True, grammar=tool_call_spec([_named(choice, tools, names)]))
    raise _bad("tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or "
                              '{"type": "function", "function": {"name": ...}}, got ' + json.dumps(choice)[:60])


def _named(choice: dict, tools: list[dict], names: list[str]) -> dict:
    """The tool a named tool_choice picks."""
    fn = choice.get("function")
    name = fn.get("name") if isinstance(fn, dict) else None
    if choice.get("type", "function") != "function" or not isinstance(name, str):
        raise _bad("tool_choice", 'a named tool_choice is {"type": "function", "function": {"name": ...}}')
    if name not in names:
        raise _bad("tool_choice", f"tool_choice names {json.dumps(name)[:60]}, which is not in 'tools' "
                                  f"({', '.join(names)})")
    return tools[names.index(name)]


def _check_tool(tool, i: int) -> str:
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type", "function") != "function":
        raise _bad(where, f"{where} must be {{\"type\": \"function\", \"function\": {{...}}}}")
    fn = tool.get("function")
    if not isinstance(fn, dict):
        raise _bad(f"{where}.function", f"{where}.function must be an object with a 'name'")
    name = fn.get("name")
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _bad(f"{where}.function.name", f"{where}.function.name must be 1-64 letters, digits, _ or -, "
                                             f"got {json.dumps(name)[:60]}")
    if fn.get("description") is not None and not isinstance(fn["description"], str):
        raise _bad(f"{where}.function.description", f"{where}.function.description must be a string")
    params = fn.get("parameters")
    if params is not None and not (isinstance(params, dict) and params.get("type", "object") == "object"):
        raise _bad(f"{where}.function.parameters", f"{where}.function.parameters must be a JSON Schema object "
                                                   '({"type": "object", "properties": {...}})')
    return name


def message_tool_fields(message: dict, i: int) -> dict:
    """The tool fields of one request message, checked: an assistant's `tool_calls`, a tool's
    `tool_call_id` (and `name`). Arguments stay the JSON strings the client sent back."""
    role = message.get("role")
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str) or not call_id:
            raise _bad(f"messages[{i}].tool_call_id", f"messages[{i}] (role tool) needs 'tool_call_id': the id "
                                                      "of the call it answers")
        out = {"tool_call_id": call_id}
        if isinstance(message.get("name"), str):
            out["name"] = message["name"]
        return out
    calls = message.get("tool_calls")
    if role != "assistant" or calls in (None, []):
        return {}
    if not isinstance(calls, list):
        raise _bad(f"messages[{i}].tool_calls", f"messages[{i}].tool_calls must be a list")
    return {"tool_calls": [_check_call(call, f"messages[{i}].tool_calls[{k}]") for k, call in enumerate(calls)]}


def _check_call(call, where: str) -> dict:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or call.get("type", "function") != "function":
        raise _bad(where, f"{where} must be {{\"type\": \"function\", \"function\": {{\"name\", \"arguments\"}}}}")
    args = fn.get("arguments", "{}")
    try:
        parsed = json.loads(args) if isinstance(args, str) else args
    except json.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        raise _bad(f"{where}.function.arguments", f"{where}.function.arguments must be a JSON object "
                                                  "(as a string, as the API returned it)")
    return {"id": str(call.get("id") or ""), "type": "function",
            "function": {"name": fn["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}}


def check_template(tokenizer) -> None:
    """A template that never mentions `tools` would drop them silently: refuse instead."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, str) and "tools" not in template:
        raise _bad("tools", "this model's chat template does not render tools; serve a model whose template "
                            "does (Qwen2.5-style `tools`), or leave 'tools' out")


def _call_ids() -> str:
    return "call_" + uuid.uuid4().hex[:20]


def _served_calls(text: str, finish: str):
    """The turn's calls when they are answered as `tool_calls`: the model stopped by itself and
    every block parsed. Otherwise None, and the text goes back as plain content."""
    if finish != "stop":
        return None
    turn = parse_tool_calls(text)
    return turn if turn.calls and not turn.errors else None


def assistant_message(text: str, finish: str, spec: ToolSpec | None) -> tuple[dict, str]:
    """(message, finish_reason) of one non-streamed choice."""
    turn = _served_calls(text, finish) if spec is not None and spec.parse else None
    if turn is not None:
        return ({"role": "assistant", "content": turn.content or None,
                 "tool_calls": openai_tool_calls(turn.calls, _call_ids())}, "tool_calls")
    return {"role": "assistant", "content": text}, finish


class ToolCallStream:
    """One streamed choice: content goes out at once until a call starts, then waits for the end.

    Text that could be the start of `<tool_call>` (and the newlines before it, which the parser
    drops from the content) is held back until the next delta shows what it is.
    """

    def __init__(self):
        self.text, self._sent, self._in_call = "", 0, False

    def push(self, delta: str) -> str:
        self.text += delta
        if self._in_call:
            return ""
        start = self.text.find(CALL_START, max(0, self._sent - len(CALL_START)))
        if start >= 0:
            self._in_call = True
            safe = len(self.text[:start].rstrip("\n"))
        else:
            safe = len(self.text) - _partial_marker(self.text)
            while safe > self._sent and self.text[safe - 1] == "\n":
                safe -= 1
        out, self._sent = self.text[self._sent:max(safe, self._sent)], max(safe, self._sent)
        return out

    def finish(self, reason: str) -> tuple[str, list[dict], str]:
        """(content still to send, tool_calls, finish_reason) once the choice has ended."""
        turn = _served_calls(self.text, reason) if self._in_call else None
        if turn is not None:
            return "", openai_tool_calls(turn.calls, _call_ids()), "tool_calls"
        rest, self._sent = self.text[self._sent:], len(self.text)
        return rest, [], reason


def _partial_marker(text: str) -> int:
    """Length of the longest tail of `text` that is a proper prefix of `<tool_call>`."""
    for k in range(min(len(CALL_START) - 1, len(text)), 0, -1):
        if CALL_START.startswith(text[-k:]):
            return k
    return 0
