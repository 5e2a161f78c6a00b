"""OpenAI tool calling through a real `rlctl serve` and the official `openai` client.

A random tiny model never writes a tool call, so the fixture first teaches one to: a plain torch
loop fits a tiny model to four short conversations rendered with the chat template and the
built-in `calculator` tool (one call and its answer, a call after some text, a malformed call, a
plain reply), until greedy decoding reproduces every assistant turn. The server then runs that
real model; nothing is mocked, so each test goes through template rendering, generation and the
hermes parser exactly as a user's request would.
"""

from __future__ import annotations

import json
import random
import signal

import pytest
from support.servers import ServerProcess

from rlctl.multiturn.builtin_tools import calculator
from rlctl.api.tools import ToolCallStream, assistant_message, check_template, parse_tools

openai = pytest.importorskip("openai")

CALC_Q = "What is 4821 * 37? Use the calculator."
TEXT_Q = "What is 12 + 30?"
BROKEN_Q = "broken"
HELLO_Q = "hello"
MALFORMED = '<tool_call>\n{"name": calculator}\n</tool_call>'


def _call(expression: str, call_id: str = "call_0") -> dict:
    return {"id": call_id, "type": "function",
            "function": {"name": "calculator", "arguments": json.dumps({"expression": expression})}}


CONVERSATIONS = [
    [{"role": "user", "content": CALC_Q},
     {"role": "assistant", "content": None, "tool_calls": [_call("4821 * 37")]},
     {"role": "tool", "tool_call_id": "call_0", "content": "178377"},
     {"role": "assistant", "content": "178377"}],
    [{"role": "user", "content": TEXT_Q},
     {"role": "assistant", "content": "Let me check.", "tool_calls": [_call("12 + 30")]}],
    [{"role": "user", "content": BROKEN_Q}, {"role": "assistant", "content": MALFORMED}],
    [{"role": "user", "content": HELLO_Q}, {"role": "assistant", "content": "Hi there."}],
]


def _tools() -> list[dict]:
    from transformers.utils import get_json_schema

    return [get_json_schema(calculator)]


def _assistant_spans(tok, conversation, tools):
    """(ids, labels): the rendered conversation, labels only on the assistant turns (and their EOS)."""
    def ids(messages, **kw):
        text = tok.apply_chat_template(messages, tools=tools, tokenize=False, **kw)
        return tok(text, add_special_tokens=False)["input_ids"]

    full = ids(conversation)
    labels = [-100] * len(full)
    for k, message in enumerate(conversation):
        if message["role"] == "assistant":
            start, end = len(ids(conversation[:k], add_generation_prompt=True)), len(ids(conversation[:k + 1]))
            labels[start:end - 1] = full[start:end - 1]  # up to <|im_end|>, not the newline after it
    return full, labels


def _greedy_turns(model, tok, tools) -> list[str]:
    import torch

    out = []
    for conversation in CONVERSATIONS:
        for k, message in enumerate(conversation):
            if message["role"] != "assistant":
                continue
            prompt = tok.apply_chat_template(conversation[:k], tools=tools, add_generation_prompt=True,
                                             return_tensors="pt", return_dict=True)
            with torch.no_grad():
                ids = model.generate(**prompt, max_new_tokens=120, do_sample=False, pad_token_id=tok.pad_token_id)
            out.append(tok.decode(ids[0, prompt["input_ids"].shape[1]:], skip_special_tokens=True))
    return out


def _expected_turns() -> list[str]:
    turns = []
    for conversation in CONVERSATIONS:
        for message in conversation:
            if message["role"] == "assistant":
                calls = [format_tool_call_text(c) for c in message.get("tool_calls") or []]
                turns.append("\n".join(([message["content"]] if message["content"] else []) + calls))
    return turns


def format_tool_call_text(call: dict) -> str:
    """What the model writes for an OpenAI-shaped call (what the chat template renders)."""
    fn = call["function"]
    return f'<tool_call>\n{{"name": "{fn["name"]}", "arguments": {fn["arguments"]}}}\n</tool_call>'


@pytest.fixture(scope="module")
def tool_model_dir(tmp_path_factory):
    """A tiny model fitted (plain torch, CPU, ~100 steps) until greedy decoding writes every assistant turn."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlctl.models.tiny import build_tiny_model

    folder = tmp_path_factory.mktemp("tool_model")
    build_tiny_model(folder, layers=2, hidden=64, heads=4, kv_heads=2, seed=0)
    tok, tools = AutoTokenizer.from_pretrained(folder), _tools()
    model = AutoModelForCausalLM.from_pretrained(folder)
    torch.manual_seed(0)
    pairs = [_assistant_spans(tok, c, tools) for c in CONVERSATIONS]
    width = max(len(ids) for ids, _ in pairs)
    input_ids = torch.tensor([ids + [tok.pad_token_id] * (width - len(ids)) for ids, _ in pairs])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in pairs])
    mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in pairs])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    expected = _expected_turns()
    learned, margin_steps = labels[:, 1:] != -100, None
    for step in range(300):
        out = model(input_ids=input_ids, attention_mask=mask, labels=labels)
        # every labelled token is the argmax given the true prefix <=> greedy decoding writes the turns;
        # a few more steps then widen the margins, so the server's batched decode agrees too
        if margin_steps is None and (out.logits[:, :-1].argmax(-1)[learned] == labels[:, 1:][learned]).all():
            margin_steps = step + 10
        if step == margin_steps:
            break
        out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    got = _greedy_turns(model, tok, tools)
    assert got == expected, f"the fixture model did not learn its conversations: {got}"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tool_client(tool_model_dir):
    srv = ServerProcess([str(tool_model_dir), "--engine", "hf", "--port", "0", "--served-model-name", "tiny"])
    yield openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
    assert srv.stop(signal.SIGTERM) == 0, "".join(srv.stderr_lines[-20:])


def _ask(client, content: str, **kw):
    kw = {"tools": _tools(), "temperature": 0, "max_tokens": 120, **kw}
    return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}], **kw)


def _prompt_tokens(tool_model_dir, messages, tools) -> int:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tool_model_dir)
    text = tok.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    return len(tok(text, add_special_tokens=False)["input_ids"])


# ---- non-streamed ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_a_call_comes_back_as_tool_calls(tool_client, tool_model_dir):
    r = _ask(tool_client, CALC_Q)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None and len(choice.message.tool_calls) == 1
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "calculator" and json.loads(call.function.arguments) == {"expression": "4821 * 37"}
    # the prompt holds the tools block: exactly the template's rendering with tools=
    assert r.usage.prompt_tokens == _prompt_tokens(tool_model_dir, [{"role": "user", "content": CALC_Q}], _tools())


@pytest.mark.slow
def test_the_tool_result_goes_back_and_the_model_answers(tool_client, tool_model_dir):
    messages = [{"role": "user", "content": CALC_Q}]
    first = _ask(tool_client, CALC_Q).choices[0].message
    messages.append(first.model_dump(exclude_none=True))  # the assistant turn with tool_calls, as returned
    for call in first.tool_calls:
        result = calculator(**json.loads(call.function.arguments))
        messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    assert messages[-1]["content"] == "178377"
    r = tool_client.chat.completions.create(model="tiny", messages=messages, tools=_tools(), temperature=0,
                                            max_tokens=40)
    assert r.choices[0].finish_reason == "stop" and r.choices[0].message.tool_calls is None
    assert r.choices[0].message.content == "178377"
    # both the assistant tool_calls turn and the tool message went through the chat template
    rendered = [messages[0], {"role": "assistant", "content": None, "tool_calls": [
        {"id": c.id, "type": "function", "function": {"name": c.function.name, "arguments": c.function.arguments}}
        for c in first.tool_calls]}, messages[2]]
    assert r.usage.prompt_tokens == _prompt_tokens(tool_model_dir, rendered, _tools())


@pytest.mark.slow
def test_text_before_the_call_is_the_content(tool_client):
    choice = _ask(tool_client, TEXT_Q).choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me check."
    assert [json.loads(c.function.arguments) for c in choice.message.tool_calls] == [{"expression": "12 + 30"}]


@pytest.mark.slow
def test_tool_choice_none_renders_the_tools_but_parses_nothing(tool_client):
    auto, none = _ask(tool_client, CALC_Q), _ask(tool_client, CALC_Q, tool_choice="none")
    assert none.usage.prompt_tokens == auto.usage.prompt_tokens  # same prompt, tools included
    choice = none.choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert choice.message.content == format_tool_call_text(_call("4821 * 37"))


@pytest.mark.slow
def test_a_malformed_call_is_returned_as_plain_content(tool_client):
    choice = _ask(tool_client, BROKEN_Q).choices[0]
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert choice.message.content == MALFORMED


@pytest.mark.slow
def test_a_reply_without_a_call_is_an_ordinary_answer(tool_client):
    choice = _ask(tool_client, HELLO_Q).choices[0]
    assert (choice.finish_reason, choice.message.content, choice.message.tool_calls) == ("stop", "Hi there.", None)


@pytest.mark.slow
def test_a_call_cut_off_by_max_tokens_stays_content(tool_client):
    choice = _ask(tool_client, CALC_Q, max_tokens=20).choices[0]
    assert choice.finish_reason == "length" and choice.message.tool_calls is None
    assert format_tool_call_text(_call("4821 * 37")).startswith(choice.message.content)


# ---- streamed -------------------------------------------------------------------------------------
def _stream(client, content: str, **kw):
    chunks = list(_ask(client, content, stream=True, **kw))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    return text, calls, finish


@pytest.mark.slow
def test_streamed_calls_arrive_as_tool_call_deltas(tool_client):
    text, calls, finish = _stream(tool_client, TEXT_Q)
    assert text == "Let me check." and finish == ["tool_calls"]
    assert [(c.index, c.type, c.function.name) for c in calls] == [(0, "function", "calculator")]
    assert json.loads(calls[0].function.arguments) == {"expression": "12 + 30"} and calls[0].id.startswith("call_")
    # the SDK's own accumulator rebuilds the same message from our chunks
    with tool_client.chat.completions.stream(model="tiny", messages=[{"role": "user", "content": TEXT_Q}],
                                             tools=_tools(), temperature=0, max_tokens=120) as stream:
        final = stream.get_final_completion().choices[0]
    assert final.finish_reason == "tool_calls" and final.message.content == "Let me check."
    assert final.message.tool_calls[0].function.arguments == calls[0].function.arguments


@pytest.mark.slow
def test_streamed_malformed_and_unparsed_calls_are_content(tool_client):
    assert _stream(tool_client, BROKEN_Q) == (MALFORMED, [], ["stop"])
    assert _stream(tool_client, CALC_Q, tool_choice="none") == (format_tool_call_text(_call("4821 * 37")), [], ["stop"])
    assert _stream(tool_client, HELLO_Q) == ("Hi there.", [], ["stop"])


# ---- bad requests ---------------------------------------------------------------------------------
FN = {"type": "function", "function": {"name": "calculator", "parameters": {"type": "object", "properties": {}}}}


@pytest.mark.slow
@pytest.mark.parametrize("extra, param, words", [
    ({"tools": {"calculator": {}}}, "tools", "must be a list"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]", '"type": "function"'),
    ({"tools": [{"type": "function"}]}, "tools[0].function", "must be an object"),
    ({"tools": [{"type": "function", "function": {"name": "add numbers"}}]}, "tools[0].function.name", "letters"),
    ({"tools": [FN, FN]}, "tools", "more than once"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]},
     "tools[0].function.parameters", "JSON Schema object"),
    ({"tools": [FN], "tool_choice": {"type": "function", "function": {"name": "search"}}}, "tool_choice",
     "not in 'tools'"),
    ({"tools": [FN], "tool_choice": {"type": "function"}}, "tool_choice", '"function": {"name": ...}'),
    ({"tools": [FN], "tool_choice": "sometimes"}, "tool_choice", "must be"),
    ({"tool_choice": "required"}, "tool_choice", "needs 'tools'"),
    ({"tools": [FN], "parallel_tool_calls": False}, "parallel_tool_calls", "not supported"),
])
def test_bad_tools_are_a_one_line_400(tool_client, extra, param, words):
    with pytest.raises(openai.BadRequestError) as caught:
        tool_client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                            max_tokens=1, **extra)
    error = caught.value.body
    assert caught.value.status_code == 400 and error["param"] == param
    assert words in error["message"] and "\n" not in error["message"]


@pytest.mark.slow
@pytest.mark.parametrize("messages, param", [
    ([{"role": "user", "content": "q"}, {"role": "tool", "content": "5"}], "messages[1].tool_call_id"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "calculator", "arguments": "{not json"}}]}],
     "messages[1].tool_calls[0].function.arguments"),
    ([{"role": "user", "content": "q"}, {"role": "assistant", "tool_calls": [{"id": "c"}]}],
     "messages[1].tool_calls[0]"),
])
def test_bad_tool_messages_are_a_400(tool_client, messages, param):
    with pytest.raises(openai.BadRequestError) as caught:
        tool_client.chat.completions.create(model="tiny", messages=messages, tools=[FN], max_tokens=1)
    assert caught.value.body["param"] == param and "\n" not in caught.value.body["message"]


@pytest.mark.slow
def test_tools_on_the_completions_route_are_refused(tool_client):
    with pytest.raises(openai.BadRequestError, match="belongs to /v1/chat/completions"):
        tool_client.completions.create(model="tiny", prompt="x", max_tokens=1, extra_body={"tools": [FN]})


# ---- the pieces, without a server -----------------------------------------------------------------
def test_a_template_without_tools_is_refused():
    from rlctl.models.tiny import build_tokenizer
    from rlctl.api.api_error import APIError

    tok = build_tokenizer()
    check_template(tok)  # the tiny template renders tools
    tok.chat_template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(APIError, match="does not render tools"):
        check_template(tok)


@pytest.mark.parametrize("text", [
    "plain answer", "", "\n\n", "<tool", "a <tool_cal", "x\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
    "pre\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>\n<tool_call>\n"
    "{\"name\": \"g\", \"arguments\": {}}\n</tool_call>",
    "<tool_call>\n{bad}\n</tool_call>", "a\n<tool_call>\n{\"name\": \"f\"", "line\n\nnext <tool_callx> z",
])
@pytest.mark.parametrize("finish", ["stop", "length"])
def test_streaming_in_any_chunks_gives_the_non_streamed_message(text, finish):
    spec = parse_tools({"tools": [FN]})
    message, want_finish = assistant_message(text, finish, spec)
    rng = random.Random(len(text))
    for _ in range(20):
        stream, content, i = ToolCallStream(), "", 0
        while i < len(text):
            j = i + rng.randint(1, 4)
            content += stream.push(text[i:j])
            i = j
        rest, calls, got_finish = stream.finish(finish)
        content += rest
        assert got_finish == want_finish
        assert content == (message["content"] or "")
        assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == \
            [(c["function"]["name"], c["function"]["arguments"]) for c in message.get("tool_calls", [])]
