"""The hermes tool-call format: what the tiny model's chat template renders is what the parser reads back."""

from __future__ import annotations

import pytest

from rlctl.models.tiny import build_tokenizer
from rlctl.multiturn.formats import ToolCall, format_tool_call, openai_tool_calls, parse_tool_calls


def test_template_rendering_parses_back_to_the_same_calls():
    tok = build_tokenizer()
    calls = [ToolCall("add", {"a": 2, "b": 3}), ToolCall("mul", {"x": [1, 2], "s": "é"})]
    messages = [{"role": "user", "content": "q"},
                {"role": "assistant", "content": "let me see", "tool_calls": openai_tool_calls(calls)}]
    text = tok.apply_chat_template(messages, tokenize=False)
    turn = text.split("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>\n")
    parsed = parse_tool_calls(turn)
    assert parsed.content == "let me see" and parsed.calls == calls and parsed.errors == []
    assert turn == "let me see\n" + "\n".join(format_tool_call(c) for c in calls)


def test_text_without_calls_is_all_content():
    assert parse_tool_calls("the answer is 5") == parse_tool_calls("the answer is 5", "hermes")
    assert parse_tool_calls("the answer is 5").calls == []


@pytest.mark.parametrize("block, why", [
    ("{not json}", "not valid JSON"),
    ('["add"]', 'must be {"name"'),
    ('{"name": "add", "arguments": "[1]"}', "must be a JSON object"),
    ('{"name": "add", "arguments": "{bad"}', "not a JSON object"),
])
def test_unreadable_blocks_are_errors_not_crashes(block, why):
    parsed = parse_tool_calls(f"x<tool_call>\n{block}\n</tool_call>")
    assert parsed.calls == [] and len(parsed.errors) == 1 and why in parsed.errors[0]


def test_an_unclosed_last_call_with_complete_json_still_counts():
    parsed = parse_tool_calls('<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n')
    assert parsed.calls == [ToolCall("add", {"a": 1})] and parsed.content == ""


def test_string_arguments_are_decoded_and_unknown_formats_refused():
    assert parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"a\\": 1}"}</tool_call>').calls == [
        ToolCall("f", {"a": 1})]
    with pytest.raises(ValueError, match="unknown tool format 'xml'"):
        parse_tool_calls("x", "xml")
