"""The Responses API's shapes (served by rlctl.api.responses): a request translated into the
chat-completions body it means, and the output items and response object built from an answer.

    input items   message (role user / system / developer / assistant; text or input_text /
                  output_text parts, input_image for a vision model), function_call (joins the
                  assistant turn before it, as the model wrote them in one turn),
                  function_call_output (a tool message); `instructions` is a system message first
    tools         Responses' flat function tools -> chat's nested ones; tool_choice likewise;
                  `text.format` -> response_format; max_output_tokens -> max_tokens
    stateless     nothing is stored: `store` is accepted and treated as false; `previous_response_id`,
                  `conversation`, `prompt`, `background` and item references are refused in one line
    accepted      fields that change nothing here (include, truncation, metadata, reasoning, user,
                  prompt_cache_key, service_tier, ...) are accepted and ignored; a function tool's
                  `strict` is accepted and its calls parsed like any other
"""

from __future__ import annotations

import json
import time
import uuid

from rlctl.api import protocol
from rlctl.api.api_error import APIError

STATELESS = "this server stores no responses (it is stateless): send the whole conversation in 'input'"
_ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
_TEXT_PARTS = ("input_text", "output_text", "text")


def _bad(param: str, message: str) -> APIError:
    return APIError(400, message, param=param)


def chat_body(body: dict) -> dict:
    """The chat-completions body a Responses body means; every field it cannot honour is a 400."""
    _refuse_stateful(body)
    messages = _instructions(body.get("instructions")) + _messages(body.get("input"))
    chat = {"model": body.get("model"), "messages": messages}
    for ours, theirs in (("max_output_tokens", "max_tokens"), ("temperature", "temperature"), ("top_p", "top_p"),
                         ("stream", "stream"), ("parallel_tool_calls", "parallel_tool_calls")):
        if body.get(ours) is not None:
            chat[theirs] = body[ours]
    tools = body.get("tools")
    if tools not in (None, []):
        if not isinstance(tools, list):
            raise _bad("tools", f"'tools' must be a list of function tools, got {type(tools).__name__}")
        chat["tools"] = [_chat_tool(tool, i) for i, tool in enumerate(tools)]
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _chat_tool_choice(body["tool_choice"])
    fmt = _response_format(body.get("text"))
    if fmt is not None:
        chat["response_format"] = fmt
    return chat


def _refuse_stateful(body: dict) -> None:
    for key in ("previous_response_id", "conversation"):
        if body.get(key) is not None:
            raise _bad(key, f"'{key}' is not supported: {STATELESS}")
    if body.get("prompt") is not None:
        raise _bad("prompt", "'prompt' (a stored prompt template) is not supported: send 'instructions' and 'input'")
    if body.get("background"):
        raise _bad("background", "'background': true is not supported: this server answers while you wait")
    include = body.get("include") or []
    if body.get("top_logprobs") or (isinstance(include, list) and "message.output_text.logprobs" in include):
        raise _bad("include", "log-probs are not supported by the built-in engine (leave out top_logprobs and "
                              "include 'message.output_text.logprobs')")


def _instructions(instructions) -> list[dict]:
    if instructions is None or instructions == "":
        return []
    if not isinstance(instructions, str):
        raise _bad("instructions", "'instructions' must be a string")
    return [{"role": "system", "content": instructions}]


def _messages(items) -> list[dict]:
    """The input as chat messages: a string is one user message; items map one to one, except that
    function_call items join the assistant message before them (one turn of the model)."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise _bad("input", "'input' must be a string or a non-empty list of items")
    messages, names = [], {}
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(where, f"{where} must be an object")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            call = _call(item, where)
            names[call["id"]] = call["function"]["name"]
            last = messages[-1] if messages else None
            if last is None or last["role"] != "assistant":
                last = {"role": "assistant", "content": ""}
                messages.append(last)
            last.setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            messages.append(_tool_message(item, where, names))
        elif kind == "item_reference":
            raise _bad(where, f"{where}: item references are not supported: {STATELESS}")
        else:
            raise _bad(where, f"{where}: items of type {json.dumps(kind)[:40]} are not supported; send message, "
                              "function_call and function_call_output items")
    return messages


def _message(item: dict, where: str) -> dict:
    role = _ROLES.get(item.get("role"))
    if role is None:
        raise _bad(f"{where}.role", f"{where}.role must be user, system, developer or assistant, "
                                    f"got {json.dumps(item.get('role'))[:40]}")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise _bad(f"{where}.content", f"{where}.content must be a string or a list of content parts")
    parts = [_part(part, f"{where}.content[{k}]") for k, part in enumerate(content)]
    if all(p["type"] == "text" for p in parts):
        return {"role": role, "content": "".join(p["text"] for p in parts)}
    return {"role": role, "content": parts}   # with images: the chat path's image_url parts


def _part(part, where: str) -> dict:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return {"type": "text", "text": part["refusal"]}
    if kind == "input_image" and isinstance(part.get("image_url"), str):
        return {"type": "image_url", "image_url": {"url": part["image_url"]}}
    raise _bad(where, f"{where}: only input_text / output_text parts (and input_image with an image_url) are "
                      f"supported, got {json.dumps(kind)[:40]}")


def _call(item: dict, where: str) -> dict:
    call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments", "{}")
    if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not isinstance(args, str):
        raise _bad(where, f"{where} (function_call) needs 'call_id', 'name' and 'arguments' (a JSON string), "
                          "as the response gave them")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def _tool_message(item: dict, where: str, names: dict) -> dict:
    call_id, output = item.get("call_id"), item.get("output")
    if not isinstance(call_id, str) or not call_id:
        raise _bad(f"{where}.call_id", f"{where} (function_call_output) needs 'call_id': the call it answers")
    if isinstance(output, list):   # content parts: only text can go into a tool message
        parts = [_part(part, f"{where}.output[{k}]") for k, part in enumerate(output)]
        if any(p["type"] != "text" for p in parts):
            raise _bad(f"{where}.output", f"{where}.output: a tool's output can hold text parts only")
        output = "".join(p["text"] for p in parts)
    if not isinstance(output, str):
        raise _bad(f"{where}.output", f"{where}.output must be a string or a list of input_text parts")
    message = {"role": "tool", "tool_call_id": call_id, "content": output}
    if call_id in names:
        message["name"] = names[call_id]
    return message


def _chat_tool(tool, i: int) -> dict:
    """Responses' flat function tool -> chat's nested one (checked there: rlctl.api.tools)."""
    where = f"tools[{i}]"
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise _bad(where, f"{where}: only function tools are supported (type {json.dumps(kind)[:40]} is a tool "
                          "OpenAI runs on its side)")
    fn = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
    return {"type": "function", "function": fn}


def _chat_tool_choice(choice):
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    if isinstance(choice, str) or isinstance(choice, dict) and choice.get("type") == "function":
        return choice   # "auto" / "none" / "required", or a malformed function choice the chat path refuses
    raise _bad("tool_choice", f"'tool_choice' must be \"auto\", \"none\", \"required\" or "
                              f'{{"type": "function", "name": ...}}, got {json.dumps(choice)[:60]}')


def _response_format(text):
    """`text.format` as chat's `response_format` (None for plain text)."""
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None or isinstance(fmt, dict) and fmt.get("type") == "text":
        return None
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    if isinstance(fmt, dict) and fmt.get("type") == "json_object":
        return {"type": "json_object"}
    raise _bad("text.format", "'text.format' must be {\"type\": \"text\"}, {\"type\": \"json_object\"} or "
                              "{\"type\": \"json_schema\", \"name\", \"schema\"}")


def in_responses_terms(e: APIError) -> APIError:
    """The chat path's error, naming the Responses fields the client sent."""
    renames = (("max_tokens", "max_output_tokens"), ("messages", "input"), ("response_format", "text.format"))
    message, param = e.message, e.param
    for chat, ours in renames:
        message = message.replace(f"'{chat}'", f"'{ours}'")
        if param is not None and param.startswith(chat):
            param = ours + param[len(chat):]
    return APIError(e.status, message, type=e.type, param=param, code=e.code)


# ---- answers ------------------------------------------------------------------------------------
def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"input_tokens": prompt_tokens, "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
            "output_tokens": completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + completion_tokens}


def message_item(text: str, status: str, item_id: str | None = None) -> dict:
    content = [] if status == "in_progress" else [text_part(text)]
    return {"id": item_id or new_id("msg"), "type": "message", "role": "assistant", "status": status,
            "content": content}


def text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(call: dict, status: str = "completed", item_id: str | None = None) -> dict:
    """A chat `tool_calls` entry (rlctl.api.tools) as a Responses function_call item."""
    return {"id": item_id or new_id("fc"), "type": "function_call", "status": status, "call_id": call["id"],
            "name": call["function"]["name"],
            "arguments": call["function"]["arguments"] if status == "completed" else ""}


def output_items(text: str, finish: str, spec) -> list[dict]:
    """A finished choice as output items: its text as a message (left out when the turn is only calls),
    then one function_call per call the hermes parser read (rlctl.api.tools.assistant_message)."""
    from rlctl.api.tools import assistant_message

    message, finish = assistant_message(text, finish, spec)
    calls = message.get("tool_calls") or []
    status = "incomplete" if finish == "length" else "completed"
    items = [message_item(message["content"] or "", status)] if message["content"] or not calls else []
    return items + [call_item(call) for call in calls]


def envelope(rid: str, model: str, body: dict, *, status: str, output: list, use: dict | None) -> dict:
    """The response object: the request's settings echoed, as OpenAI does, beside the output."""
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {"id": rid, "object": "response", "created_at": int(time.time()), "status": status, "error": None,
            "incomplete_details": incomplete, "instructions": body.get("instructions"),
            "max_output_tokens": body.get("max_output_tokens"), "model": model, "output": output,
            "parallel_tool_calls": body.get("parallel_tool_calls", True), "previous_response_id": None,
            "reasoning": {"effort": None, "summary": None}, "store": False,
            "temperature": body.get("temperature", 1.0), "text": body.get("text") or {"format": {"type": "text"}},
            "tool_choice": body.get("tool_choice", "auto"), "tools": body.get("tools") or [],
            "top_p": body.get("top_p", 1.0), "truncation": body.get("truncation") or "disabled",
            "usage": use, "metadata": body.get("metadata") or {}, "user": None}
