"""Structured output and forced tool calls: a request's `response_format` and a forced `tool_choice`,
checked and turned into the grammar spec the engine decodes under (rlctl.workers.rollout.grammar).

    response_format  {"type": "text"} (the default) | {"type": "json_object"}
                     | {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}
    tool_choice      "required": one call of one of `tools`; {"type": "function", "function":
                     {"name": N}}: one call of N; arguments valid for the tool's `parameters`

The spec is checked here by building its grammar, so a schema the grammar library cannot follow
is a 400 naming it, never a failed generation. Answers under a grammar always parse unless they
are cut off (finish_reason "length").
"""

from __future__ import annotations

import json

from rlctl.api.api_error import APIError


def response_format_spec(body: dict) -> str | None:
    """The grammar spec of the request's response_format; None for text (or none)."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return _checked({"type": "json_object"}, "response_format")
    if kind == "json_schema":
        inner = fmt.get("json_schema")
        schema = inner.get("schema") if isinstance(inner, dict) else None
        if not isinstance(schema, dict):
            raise APIError(400, "'response_format.json_schema.schema' must be a JSON Schema object "
                                '({"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}})',
                           param="response_format")
        return _checked({"type": "json_schema", "schema": schema}, "response_format")
    raise APIError(400, "'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got "
                        f"{json.dumps(kind)[:60]}", param="response_format")


def tool_call_spec(tools: list[dict]) -> str:
    """The grammar spec of one call of one of `tools` (checked OpenAI function tools)."""
    functions = [t["function"] for t in tools]
    return _checked({"type": "tool_call", "tools": [{"name": f["name"], "parameters": f.get("parameters")}
                                                    for f in functions]}, "tools")


def _checked(spec: dict, param: str) -> str:
    from rlctl.workers.rollout.grammar import build_grammar

    text = json.dumps(spec, separators=(",", ":"))   # key order kept: a schema's property order is the output's
    try:
        build_grammar(text)
    except ValueError as e:
        raise APIError(400, f"'{param}': this JSON Schema cannot be decoded under a grammar: {e}",
                       param=param) from None
    return text
