"""The Responses API (`POST /v1/responses`) of a real `rlctl serve`, through the official `openai` client.

The server runs the session's tool-calling tiny model (tests/support/tool_model.py: "What is 2 + 2?" ->
a calculator call -> the tool's answer "4" -> "4"), greedy, so each answer is known. Each Responses
call is compared with the same conversation sent to /v1/chat/completions: the same prompt tokens, the
same text, the same call.
"""

from __future__ import annotations

import json
import signal

import pytest
from support.servers import ServerProcess

openai = pytest.importorskip("openai")

QUESTION = "What is 2 + 2?"


def calc_tool() -> dict:
    """The built-in calculator in Responses' flat function-tool shape (what the tool model learnt)."""
    from transformers.utils import get_json_schema

    from rlctl.multiturn.builtin_tools import calculator

    return {"type": "function", "strict": True, **get_json_schema(calculator)["function"]}


def chat_tool() -> dict:
    fn = {k: v for k, v in calc_tool().items() if k not in ("type", "strict")}
    return {"type": "function", "function": fn}


@pytest.fixture(scope="module")
def client(tool_model_dir):
    srv = ServerProcess([str(tool_model_dir), "--engine", "hf", "--port", "0", "--served-model-name", "tiny"])
    yield openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    assert srv.stop(signal.SIGTERM) == 0, "".join(srv.stderr_lines[-20:])


def _respond(client, input, **kw):
    kw = {"tools": [calc_tool()], "temperature": 0, "max_output_tokens": 120, **kw}
    return client.responses.create(model="tiny", input=input, **kw)


def _chat(client, messages, **kw):
    return client.chat.completions.create(model="tiny", messages=messages, tools=[chat_tool()], temperature=0,
                                          max_tokens=120, **kw)


@pytest.mark.slow
def test_a_function_call_then_its_output_then_the_answer(client):
    first = _respond(client, QUESTION, instructions=None, store=True, include=["reasoning.encrypted_content"],
                     truncation="auto", metadata={"k": "v"}, parallel_tool_calls=True, prompt_cache_key="x")
    assert first.status == "completed" and first.object == "response" and first.id.startswith("resp_")
    assert [item.type for item in first.output] == ["function_call"]
    call = first.output[0]
    assert call.name == "calculator" and json.loads(call.arguments) == {"expression": "2+2"}
    assert call.call_id.startswith("call_") and call.status == "completed"
    # the same conversation as chat completions: the same prompt and the same call
    chat = _chat(client, [{"role": "user", "content": QUESTION}])
    assert first.usage.input_tokens == chat.usage.prompt_tokens
    assert first.usage.output_tokens == chat.usage.completion_tokens
    assert chat.choices[0].message.tool_calls[0].function.arguments == call.arguments

    # the agent's loop: the output items go back as input, with the function's output after them
    history = [{"role": "user", "content": QUESTION}, *[item.model_dump(exclude_none=True) for item in first.output],
               {"type": "function_call_output", "call_id": call.call_id, "output": "4"}]
    second = _respond(client, history)
    assert second.status == "completed" and [item.type for item in second.output] == ["message"]
    assert second.output_text == "4" and second.output[0].content[0].type == "output_text"
    messages = [{"role": "user", "content": QUESTION},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": call.call_id, "type": "function",
                     "function": {"name": call.name, "arguments": call.arguments}}]},
                {"role": "tool", "tool_call_id": call.call_id, "content": "4"}]
    again = _chat(client, messages)
    assert second.usage.input_tokens == again.usage.prompt_tokens and again.choices[0].message.content == "4"


@pytest.mark.slow
def test_instructions_and_message_items_render_like_chat_messages(client):
    items = [{"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Be brief."}]},
             {"role": "user", "content": [{"type": "input_text", "text": "hello "}, {"type": "input_text", "text": "there"}]}]
    r = _respond(client, items, instructions="You are a calculator.", tools=[], max_output_tokens=5)
    chat = client.chat.completions.create(model="tiny", temperature=0, max_tokens=5, messages=[
        {"role": "system", "content": "You are a calculator."}, {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello there"}])
    assert r.usage.input_tokens == chat.usage.prompt_tokens
    assert r.output_text == chat.choices[0].message.content
    assert r.status == {"stop": "completed", "length": "incomplete"}[chat.choices[0].finish_reason]


@pytest.mark.slow
def test_the_event_stream_of_a_call_and_of_text(client):
    events = list(_respond(client, QUESTION, stream=True))
    kinds = [e.type for e in events]
    assert kinds == ["response.created", "response.in_progress", "response.output_item.added",
                     "response.function_call_arguments.delta", "response.function_call_arguments.done",
                     "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = events[-1].response
    assert done.status == "completed" and done.usage.input_tokens > 0
    assert json.loads(done.output[0].arguments) == {"expression": "2+2"} and done.output[0].name == "calculator"

    text = list(_respond(client, "hello", tools=[], stream=True, max_output_tokens=6))
    kinds = [e.type for e in text]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    whole = _respond(client, "hello", tools=[], max_output_tokens=6)
    assert "".join(e.delta for e in text[4:-4]) == text[-4].text == whole.output_text
    # max_output_tokens cut the answer: incomplete, as OpenAI says it
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.output[0].status == "incomplete" and whole.usage.output_tokens == 6


@pytest.mark.slow
def test_the_clients_stream_helper_accumulates_the_same_response(client):
    with client.responses.stream(model="tiny", input=QUESTION, tools=[calc_tool()], temperature=0,
                                 max_output_tokens=120) as stream:
        final = stream.get_final_response()
    whole = _respond(client, QUESTION)
    assert [(i.type, i.name, i.arguments) for i in final.output] == [(i.type, i.name, i.arguments) for i in whole.output]


@pytest.mark.slow
@pytest.mark.parametrize("extra, param, words", [
    ({"previous_response_id": "resp_1"}, "previous_response_id", "stateless"),
    ({"conversation": "conv_1"}, "conversation", "stateless"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]", "stateless"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0]", "not supported"),
    ({"tools": [{"type": "web_search"}]}, "tools[0]", "only function tools"),
    ({"max_output_tokens": 10**6}, "max_output_tokens", "'max_output_tokens'"),
    ({"input": [{"role": "robot", "content": "x"}]}, "input[0].role", "user, system, developer or assistant"),
    ({"input": [{"type": "function_call_output", "output": "4"}]}, "input[0].call_id", "call_id"),
])
def test_what_cannot_be_honoured_is_one_400(client, extra, param, words):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(**{"model": "tiny", "input": QUESTION, **extra})
    body = err.value.body
    assert body["param"] == param and words in body["message"], body


@pytest.mark.slow
def test_a_forced_call_and_structured_output_come_through_the_grammar(client):
    forced = _respond(client, "hello", tool_choice={"type": "function", "name": "calculator"}, temperature=1.0,
                      max_output_tokens=200)
    assert [item.type for item in forced.output] == ["function_call"] and forced.output[0].name == "calculator"
    assert set(json.loads(forced.output[0].arguments)) == {"expression"}
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
              "additionalProperties": False}
    shaped = _respond(client, QUESTION, tools=[], max_output_tokens=200, temperature=1.0,
                      text={"format": {"type": "json_schema", "name": "result", "schema": schema, "strict": True}})
    assert shaped.status == "completed" and isinstance(json.loads(shaped.output_text)["answer"], int)
