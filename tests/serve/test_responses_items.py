"""The Responses API's translation (rlctl.api.responses_items), without a server: the chat-completions body a
Responses body means, and the output items an answer becomes. (Served end to end through the `openai`
client: test_serve_responses.py and tests/agent/test_responses_agent.py.)"""

from __future__ import annotations

import json

import pytest

from rlctl.api.api_error import APIError
from rlctl.api.responses_items import chat_body, in_responses_terms, output_items
from rlctl.api.tools import ToolSpec

CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'


def test_items_become_the_chat_messages_they_mean():
    body = {"model": "m", "instructions": "Be brief.", "max_output_tokens": 9, "temperature": 0, "store": True,
            "include": ["reasoning.encrypted_content"], "truncation": "auto", "metadata": {"a": "b"},
            "input": [
                {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Use tools."}]},
                {"role": "user", "content": [{"type": "input_text", "text": "1 + "}, {"type": "input_text", "text": "1?"}]},
                {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                 "content": [{"type": "output_text", "text": "Let me add.", "annotations": []}]},
                {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 1}', "id": "fc_1"},
                {"type": "function_call", "call_id": "c2", "name": "add", "arguments": '{"a": 2}'},
                {"type": "function_call_output", "call_id": "c1", "output": "2"},
                {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "3"}]},
            ]}
    chat = chat_body(body)
    assert chat["max_tokens"] == 9 and chat["temperature"] == 0 and "store" not in chat
    assert chat["messages"] == [
        {"role": "system", "content": "Be brief."}, {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "1 + 1?"},
        {"role": "assistant", "content": "Let me add.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}},
            {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "2", "name": "add"},
        {"role": "tool", "tool_call_id": "c2", "content": "3", "name": "add"}]


def test_calls_without_text_start_their_own_assistant_turn():
    chat = chat_body({"input": [{"role": "user", "content": "q"},
                                {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]})
    assert chat["messages"][1] == {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}


def test_tools_tool_choice_and_text_format_become_chat_s():
    tool = {"type": "function", "name": "add", "description": "Add.", "strict": True,
            "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}
    chat = chat_body({"input": "q", "tools": [tool], "tool_choice": {"type": "function", "name": "add"},
                      "text": {"format": {"type": "json_schema", "name": "r", "schema": {"type": "object"}}}})
    assert chat["tools"] == [{"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters")}}]
    assert chat["tool_choice"] == {"type": "function", "function": {"name": "add"}}
    assert chat["response_format"] == {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}}
    assert "response_format" not in chat_body({"input": "q", "text": {"format": {"type": "text"}}})
    assert chat_body({"input": "q", "tool_choice": "required"})["tool_choice"] == "required"


@pytest.mark.parametrize("body, param", [
    ({"input": "q", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "q", "background": True}, "background"),
    ({"input": "q", "top_logprobs": 2}, "include"),
    ({"input": []}, "input"),
    ({"input": [{"type": "message", "role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "input[0].content[0]"),
    ({"input": [{"type": "function_call", "name": "f"}]}, "input[0]"),
    ({"input": "q", "tools": [{"type": "file_search"}]}, "tools[0]"),
    ({"input": "q", "tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"input": "q", "text": {"format": {"type": "grammar"}}}, "text.format"),
])
def test_what_cannot_be_honoured_is_a_400_naming_the_field(body, param):
    with pytest.raises(APIError) as err:
        chat_body(body)
    assert err.value.status == 400 and err.value.param == param


def test_chat_path_errors_name_the_responses_fields():
    e = in_responses_terms(APIError(400, "'max_tokens' must be at least 1, got 0", param="max_tokens"))
    assert (e.message, e.param) == ("'max_output_tokens' must be at least 1, got 0", "max_output_tokens")
    assert in_responses_terms(APIError(400, "x", param="messages[2].content")).param == "input[2].content"


def test_an_answer_becomes_output_items():
    spec = ToolSpec([], parse=True)
    text, call = output_items("Let me add.\n" + CALL, "stop", spec)
    assert text["type"] == "message" and text["content"][0]["text"] == "Let me add." and text["status"] == "completed"
    assert (call["type"], call["name"], json.loads(call["arguments"])) == ("function_call", "add", {"a": 1})
    assert call["call_id"].startswith("call_") and call["id"].startswith("fc_")
    [only_call] = output_items(CALL, "stop", spec)
    assert only_call["type"] == "function_call"
    [cut] = output_items(CALL, "length", spec)   # a cut-off turn is text, never a half-written call
    assert cut["type"] == "message" and cut["status"] == "incomplete" and cut["content"][0]["text"] == CALL
    [plain] = output_items(CALL, "stop", None)   # no tools: the text as written
    assert plain["content"][0]["text"] == CALL
