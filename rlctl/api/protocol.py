"""The OpenAI wire format: validate request bodies, build responses, chunks and error JSON.

Every way a body can be wrong becomes an `APIError` with a 4xx status and OpenAI's error shape
({"error": {"message", "type", "param", "code"}}), so clients raise their usual exceptions.
Unknown fields are ignored (like vLLM); known fields the built-in engine cannot honour
(logprobs, penalties) are refused rather than silently dropped. Tools are checked and turned into
`tool_calls` by rlctl.api.tools; a forced tool_choice and `response_format` JSON are decoded under a
grammar (rlctl.api.constraints).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlctl.api.api_error import APIError
from rlctl.api.requests import SamplingParams

if TYPE_CHECKING:
    from rlctl.api.tools import ToolSpec

MAX_STOP = 16
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's legacy /v1/completions default


@dataclass
class ParsedRequest:
    kind: str  # "chat" | "completion"
    prompts: list[list[int]]
    params: SamplingParams
    stream: bool
    include_usage: bool
    tools: ToolSpec | None = None  # chat with tools: render them, maybe parse calls out of the answers
    prompt_logprobs: list | None = None  # completions: vLLM's prompt_logprobs per prompt (serve/prompt_logprobs.py)
    visions: list | None = None  # chat with images: per prompt its image arrays (rlctl.api.vision)


def _field(body: dict, key: str, types: tuple, default=None, *, nullable: bool = True):
    """body[key] checked against `types` (bool is never accepted as a number)."""
    value = body.get(key, default)
    if value is None and nullable:
        return default
    numeric = int in types or float in types
    if not isinstance(value, types) or (numeric and isinstance(value, bool) and bool not in types):
        names = " or ".join("number" if t is float else t.__name__ for t in types)
        raise APIError(400, f"'{key}' must be {names}, got {type(value).__name__}", param=key)
    return value


def _in_range(key: str, value, lo, hi) -> None:
    if not lo <= value <= hi:
        raise APIError(400, f"'{key}' must be between {lo} and {hi}, got {value}", param=key)


def _refuse_unsupported(body: dict) -> None:
    """Fields whose meaning we cannot honour: better a clear 400 than a silently different answer."""
    for key in ("logprobs", "top_logprobs", "echo", "suffix", "functions", "logit_bias"):
        if body.get(key) not in (None, False, [], 0):
            raise APIError(400, f"'{key}' is not supported by the built-in engine "
                                "(use --engine vllm or sglang)", param=key)
    for key in ("presence_penalty", "frequency_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            raise APIError(400, f"'{key}' is not supported by the built-in engine", param=key)


def _grammar(body: dict, spec: ToolSpec | None = None) -> str | None:
    """The grammar the answer is decoded under: a forced tool_choice's or response_format's."""
    from rlctl.api.constraints import response_format_spec

    fmt = response_format_spec(body)
    if fmt is not None and spec is not None and spec.grammar is not None:
        raise APIError(400, "a forced 'tool_choice' and a JSON 'response_format' cannot both shape one answer; "
                            "send one of them", param="response_format")
    return fmt if fmt is not None else (spec.grammar if spec is not None else None)


def _sampling(body: dict, prompt_lens: list[int], context: int, max_n: int, default_max,
              grammar: str | None = None) -> tuple:
    temperature = float(_field(body, "temperature", (int, float), 1.0))
    _in_range("temperature", temperature, 0.0, 2.0)
    top_p = float(_field(body, "top_p", (int, float), 1.0))
    if not 0.0 < top_p <= 1.0:
        raise APIError(400, f"'top_p' must be in (0, 1], got {top_p}", param="top_p")
    top_k = _field(body, "top_k", (int,), 0)
    if top_k < -1:
        raise APIError(400, f"'top_k' must be -1, 0 (off) or positive, got {top_k}", param="top_k")
    n = _field(body, "n", (int,), 1)
    _in_range("n", n, 1, max_n)
    seed = _field(body, "seed", (int,), None)
    stop = stop_strings(body.get("stop"), "stop")
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = _field(body, key, (int,), None)
    longest = max(prompt_lens)
    if longest >= context:
        raise APIError(400, f"This model's maximum context length is {context} tokens, but the prompt "
                            f"has {longest}; shorten the prompt", param="messages",
                       code="context_length_exceeded")
    if max_tokens is None:
        max_tokens = context - longest if default_max is None else min(default_max, context - longest)
    if max_tokens < 1:
        raise APIError(400, f"'{key}' must be at least 1, got {max_tokens}", param=key)
    if longest + max_tokens > context:
        raise APIError(400, f"This model's maximum context length is {context} tokens. However, you "
                            f"requested {longest + max_tokens} tokens ({longest} in the prompt, "
                            f"{max_tokens} for the completion); reduce '{key}' or the prompt",
                       param=key, code="context_length_exceeded")
    ignore_eos = _field(body, "ignore_eos", (bool,), False)
    params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                            top_k=max(top_k, 0), n=n, stop=tuple(stop), seed=seed, ignore_eos=ignore_eos,
                            grammar=grammar)
    stream = _field(body, "stream", (bool,), False)
    options = _field(body, "stream_options", (dict,), {})
    include_usage = bool(options.get("include_usage", False))
    return params, stream, include_usage


def stop_strings(value, param: str) -> tuple[str, ...]:
    """`stop` as OpenAI takes it: null, a string, or a list of at most MAX_STOP strings."""
    stop = [] if value is None else [value] if isinstance(value, str) else value
    if not isinstance(stop, list) or len(stop) > MAX_STOP or not all(isinstance(s, str) for s in stop):
        raise APIError(400, f"'{param}' must be a string or a list of at most {MAX_STOP} strings, got "
                            f"{_short(value)}", param=param)
    return tuple(stop)


def token_ids(value, vocab: int, param: str) -> list[int]:
    """A non-empty list of token ids, each in [0, vocab): one outside would index past the embedding."""
    if not isinstance(value, list) or not value or not all(isinstance(t, int) and not isinstance(t, bool)
                                                           for t in value):
        raise APIError(400, f"'{param}' must be a non-empty list of integers", param=param)
    bad = next((t for t in value if not 0 <= t < vocab), None)
    if bad is not None:
        raise APIError(400, f"'{param}' holds token id {bad}, outside this model's vocabulary [0, {vocab})",
                       param=param)
    return list(value)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _message(message, i: int) -> dict:
    """One request message as the chat template takes it: role, text content, tool fields."""
    from rlctl.api.tools import message_tool_fields

    return {**_message_text(message, i), **message_tool_fields(message, i)}


def _message_text(message, i: int) -> dict:
    if not isinstance(message, dict):
        raise APIError(400, f"messages[{i}] must be an object", param=f"messages[{i}]")
    role = message.get("role")
    if not isinstance(role, str) or not role:
        raise APIError(400, f"messages[{i}].role must be a non-empty string", param=f"messages[{i}].role")
    content = message.get("content")
    if content is None:
        content = ""
    elif isinstance(content, list) and any(isinstance(p, dict) and p.get("type") == "image" for p in content):
        pass   # text and image parts (rlctl.api.vision.content_parts made them): the VLM's template renders them
    elif isinstance(content, list):  # content parts: only text can be rendered by a text model
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise APIError(400, f"messages[{i}].content: only text parts are supported",
                           param=f"messages[{i}].content")
        content = "".join(p["text"] for p in content)
    elif not isinstance(content, str):
        raise APIError(400, f"messages[{i}].content must be a string or a list of text parts",
                       param=f"messages[{i}].content")
    return {"role": role, "content": content}


def parse_chat(body: dict, engine, max_n: int) -> ParsedRequest:
    _refuse_unsupported(body)
    messages = _field(body, "messages", (list,), nullable=False) if "messages" in body else None
    if not messages:
        raise APIError(400, "'messages' must be a non-empty list", param="messages")
    from rlctl.api.tools import check_template, parse_tools

    spec = parse_tools(body)
    grammar = _grammar(body, spec)
    messages, images = _images(messages, engine)
    messages = [_message(m, i) for i, m in enumerate(messages)]
    if not getattr(engine.tokenizer, "chat_template", None):
        raise APIError(400, "this model has no chat template; use /v1/completions", param="messages")
    if spec is not None:
        check_template(engine.tokenizer)
    tools, vision = spec.tools if spec else None, None
    try:
        if images:
            prompt, vision = engine.encode_vision_chat(messages, images, tools=tools)
        else:
            prompt = engine.encode_chat(messages, tools=tools)
    except Exception as e:  # a template can raise on roles it does not know (jinja raise_exception)
        raise APIError(400, f"the chat template rejected these messages: {e}", param="messages") from e
    params, stream, usage = _sampling(body, [len(prompt)], engine.context_length, max_n, None, grammar)
    return ParsedRequest("chat", [prompt], params, stream, usage, spec, visions=[vision] if vision else None)


def _images(messages: list, engine) -> tuple[list, list]:
    """(messages with image_url parts turned into template image parts, the PIL images in order)."""
    from rlctl.api.vision import content_parts, has_images

    if not has_images(messages):
        return messages, []
    if getattr(engine, "processor", None) is None:
        raise APIError(400, "this model takes no images (image_url parts need a vision-language model)",
                       param="messages")
    out, images = [], []
    for i, m in enumerate(messages):
        if isinstance(m, dict) and isinstance(m.get("content"), list):
            parts, found = content_parts(m["content"], i, engine.allow_remote_images)
            m, images = {**m, "content": parts}, images + found
        out.append(m)
    return out, images


def parse_completion(body: dict, engine, max_n: int) -> ParsedRequest:
    _refuse_unsupported(body)
    for key in ("tools", "tool_choice"):
        if body.get(key) is not None:
            raise APIError(400, f"'{key}' belongs to /v1/chat/completions, not /v1/completions", param=key)
    if body.get("best_of") not in (None, 1, body.get("n", 1)):
        raise APIError(400, "'best_of' is not supported by the built-in engine", param="best_of")
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        prompts = [_encode(engine, prompt)]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = [_encode(engine, p) for p in prompt]
    elif _is_ids(prompt, engine):
        prompts = [list(prompt)]
    elif isinstance(prompt, list) and prompt and all(_is_ids(p, engine) for p in prompt):
        prompts = [list(p) for p in prompt]
    else:
        raise APIError(400, "'prompt' must be a string, a list of strings, or token ids", param="prompt")
    if any(len(p) == 0 for p in prompts):
        raise APIError(400, "'prompt' must not be empty", param="prompt")
    params, stream, usage = _sampling(body, [len(p) for p in prompts], engine.context_length,
                                      max_n, COMPLETION_DEFAULT_MAX_TOKENS, _grammar(body))
    if len(prompts) * params.n > max_n:
        raise APIError(400, f"prompts x n = {len(prompts) * params.n} exceeds this server's limit "
                            f"of {max_n} sequences per request", param="prompt")
    return ParsedRequest("completion", prompts, params, stream, usage)


def _encode(engine, text: str) -> list[int]:
    try:
        return engine.encode(text)
    except (TypeError, ValueError) as e:  # e.g. a lone UTF-16 surrogate from a "\\ud800" escape
        raise APIError(400, f"'prompt' cannot be tokenized: {e}", param="prompt") from None


def _is_ids(value, engine) -> bool:
    vocab = len(engine.tokenizer)
    return (isinstance(value, list) and len(value) > 0
            and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in value))


# ---- responses ------------------------------------------------------------------------------------
def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def response(kind: str, rid: str, model: str, choices: list[tuple[str, str]], use: dict,
             tools: ToolSpec | None = None, prompt_logprobs: list | None = None) -> dict:
    """A whole (non-streamed) answer; `choices` are (text, finish_reason) by index; prompt_logprobs:
    one entry per choice (its prompt's), when the request asked for them."""
    if kind == "chat":
        from rlctl.api.tools import assistant_message

        messages = [assistant_message(text, finish, tools) for text, finish in choices]
        out = [{"index": i, "message": message, "logprobs": None, "finish_reason": finish}
               for i, (message, finish) in enumerate(messages)]
        obj = "chat.completion"
    else:
        out = [{"index": i, "text": text, "logprobs": None, "finish_reason": finish}
               for i, (text, finish) in enumerate(choices)]
        obj = "text_completion"
        for choice, entries in zip(out, prompt_logprobs or ()):
            choice["prompt_logprobs"] = entries
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": out,
            "usage": use, "system_fingerprint": None}


def chunk(kind: str, rid: str, model: str, index: int, text: str | None, finish: str | None,
          *, role: bool = False, tool_call: tuple[int, dict] | None = None) -> dict:
    """One streamed piece of one choice (OpenAI chunk format); `tool_call` = (its index, the call)."""
    if kind == "chat":
        delta = {"role": "assistant", "content": ""} if role else ({} if text is None else {"content": text})
        if tool_call is not None:
            delta = {"tool_calls": [{"index": tool_call[0], **tool_call[1]}]}
        choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": index, "text": text or "", "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [choice]}


def usage_chunk(kind: str, rid: str, model: str, use: dict) -> dict:
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [],
            "usage": use}
