"""Forced tool calls and structured output on the built-in engine, through a real `rlctl serve` (the
session's tiny random model) and the official openai client: under a grammar even a random model's
answers parse, every seed, into a call of an allowed tool with arguments valid for its schema, or
into JSON valid for the requested schema."""

from __future__ import annotations

import concurrent.futures
import json

import jsonschema
import pytest

pytestmark = pytest.mark.slow   # the folder's shared `rlctl serve` process

openai = pytest.importorskip("openai")

ADD = {"type": "object", "properties": {"a": {"type": "integer"}, "op": {"type": "string", "enum": ["+", "-"]},
                                        "exact": {"type": "boolean"}},
       "required": ["a", "op", "exact"]}
TOOLS = [{"type": "function", "function": {"name": "add", "description": "add a number", "parameters": ADD}},
         {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
CITY = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 6},
                                         "days": {"type": "integer", "minimum": 1, "maximum": 9},
                                         "tags": {"type": "array", "items": {"enum": ["sun", "rain"]}, "maxItems": 3}},
        "required": ["city", "days", "tags"]}
SEEDS = range(6)
ASK = [{"role": "user", "content": "What is 40 + 2?"}]


def _chat(client, seed: int, **kw):
    return client.chat.completions.create(model="tiny", messages=ASK, seed=seed, **{"max_tokens": 200, **kw})


@pytest.mark.parametrize("seed", SEEDS)
def test_tool_choice_required_always_answers_a_valid_call(client, seed):
    choice = _chat(client, seed, tools=TOOLS, tool_choice="required").choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name in PARAMS and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


@pytest.mark.parametrize("seed", SEEDS[:3])
def test_a_named_tool_choice_calls_that_function(client, seed):
    named = {"type": "function", "function": {"name": "add"}}
    choice = _chat(client, seed, tools=TOOLS, tool_choice=named, temperature=1.5).choices[0]
    (call,) = choice.message.tool_calls
    assert choice.finish_reason == "tool_calls" and call.function.name == "add"
    jsonschema.validate(json.loads(call.function.arguments), ADD)


@pytest.mark.parametrize("seed", SEEDS[:4])
def test_response_format_json_schema_parses_and_validates(client, seed):
    fmt = {"type": "json_schema", "json_schema": {"name": "trip", "schema": CITY, "strict": True}}
    choice = _chat(client, seed, response_format=fmt).choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    jsonschema.validate(json.loads(choice.message.content), CITY)


def test_response_format_json_object_is_an_object_on_chat_and_completions(client):
    chat = _chat(client, 3, response_format={"type": "json_object"}, temperature=0)
    assert isinstance(json.loads(chat.choices[0].message.content), dict)
    text = client.completions.create(model="tiny", prompt="{", max_tokens=200, seed=1, n=2,
                                     extra_body={"response_format": {"type": "json_object"}})
    assert all(isinstance(json.loads(c.text), dict) for c in text.choices)


def test_a_forced_call_streams_as_one_tool_call_delta(client):
    chunks = list(_chat(client, 4, tools=TOOLS, tool_choice="required", stream=True))
    deltas = [d for c in chunks for d in (c.choices[0].delta.tool_calls or [])]
    assert len(deltas) == 1 and chunks[-1].choices[0].finish_reason == "tool_calls"
    jsonschema.validate(json.loads(deltas[0].function.arguments), PARAMS[deltas[0].function.name])
    assert not "".join(c.choices[0].delta.content or "" for c in chunks)


def test_free_requests_beside_constrained_ones_keep_their_tokens(client):
    """A seeded request draws the same tokens whether or not constrained rows share its batch."""
    alone = _chat(client, 11, max_tokens=40).choices[0].message.content
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        forced = [pool.submit(_chat, client, s, tools=TOOLS, tool_choice="required") for s in (1, 2, 3)]
        free = pool.submit(_chat, client, 11, max_tokens=40)
        assert all(f.result().choices[0].finish_reason == "tool_calls" for f in forced)
    assert free.result().choices[0].message.content == alone


@pytest.mark.parametrize("extra, param, words", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format", "schema"),
    ({"response_format": {"type": "yaml"}}, "response_format", "must be"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
      "properties": {"a": {"$ref": "#/missing"}}}}}}, "response_format", "cannot be decoded under a grammar"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format",
     "cannot both"),
])
def test_bad_structured_requests_are_a_one_line_400(client, extra, param, words):
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model="tiny", messages=ASK, max_tokens=4, **extra)
    error = caught.value.body
    assert error["param"] == param and words in error["message"] and "\n" not in error["message"]
