"""SFT samples: the loss mask marks exactly the assistant's tokens, checked against apply_chat_template;
verl's SFT columns read unchanged; bad data is one clear DataError."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlctl.config.schema import SFTConfig
from rlctl.data.sft import build_samples, conversations, tokenize_conversation
from rlctl.errors import DataError
from rlctl.models.tiny import build_tokenizer

TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b",
                                           "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def template_ids(tok, messages, tools=None) -> list[int]:
    ids = tok.apply_chat_template(messages, tools=tools, tokenize=True)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def expected_mask(tok, ids: list[int]) -> list[float]:
    """Independently of rlctl: walk the ChatML token stream; inside each `<|im_start|>assistant\\n`
    turn, every token after the header up to and including its `<|im_end|>` is the assistant's."""
    start, end, newline = (tok.convert_tokens_to_ids(t) for t in ("<|im_start|>", "<|im_end|>", "Ċ"))
    mask, i = [0.0] * len(ids), 0
    while i < len(ids):
        if ids[i] != start:
            i += 1
            continue
        role_end = ids.index(newline, i)
        role = tok.decode(ids[i + 1:role_end])
        close = ids.index(end, role_end)
        if role == "assistant":
            for t in range(role_end + 1, close + 1):
                mask[t] = 1.0
        i = close + 1
    return mask


def assistant_text(tok, ids, mask) -> list[str]:
    segments, cur = [], []
    for t, m in zip(ids, mask):
        if m:
            cur.append(t)
        elif cur:
            segments.append(tok.decode(cur))
            cur = []
    return segments + ([tok.decode(cur)] if cur else [])


CHATS = {
    "single-turn": ([{"role": "user", "content": "What is 2+3?"}, {"role": "assistant", "content": "5"}], None),
    "system + two turns": ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"},
                            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "2+2?"},
                            {"role": "assistant", "content": "4\nthat's all"}], None),
    "tool calls": ([{"role": "user", "content": "Add 2 and 3, then 4 and 5."},
                    {"role": "assistant", "content": "",
                     "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}},
                                    {"type": "function", "function": {"name": "add", "arguments": '{"a": 4, "b": 5}'}}]},
                    {"role": "tool", "content": "5"}, {"role": "tool", "content": "9"},
                    {"role": "assistant", "content": "Let me check.",
                     "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 5, "b": 9}}}]},
                    {"role": "tool", "content": "14"},
                    {"role": "assistant", "content": "5 and 9 (sum 14)"}], TOOLS),
}


@pytest.mark.parametrize("name", sorted(CHATS))
def test_assistant_mask_is_exact(tok, name):
    messages, tools = CHATS[name]
    ids, mask = tokenize_conversation(tok, messages, tools)
    assert ids == template_ids(tok, messages, tools)   # the template's own tokens, nothing re-tokenized
    assert mask == expected_mask(tok, ids)
    assert sum(mask) > 0


def test_masked_text_is_content_tool_calls_and_end_of_turn(tok):
    messages, tools = CHATS["tool calls"]
    ids, mask = tokenize_conversation(tok, messages, tools)
    segments = assistant_text(tok, ids, mask)
    assert segments[0] == ('<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>\n'
                           '<tool_call>\n{"name": "add", "arguments": {"a": 4, "b": 5}}\n</tool_call><|im_end|>')
    assert segments[1].startswith("Let me check.\n<tool_call>") and segments[1].endswith("</tool_call><|im_end|>")
    assert segments[2] == "5 and 9 (sum 14)<|im_end|>"
    assert not any("<tool_response>" in s or "assistant\n" in s for s in segments)   # tool results, headers: no loss


def test_all_tokens_switch(tok):
    messages, tools = CHATS["system + two turns"]
    ids, mask = tokenize_conversation(tok, messages, tools, assistant_only=False)
    assert mask == [1.0] * len(ids)


def write(path, rows):
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_verl_columns(tmp_path, tok):
    # verl's gsm8k SFT example: prompt_key=extra_info + prompt_dict_keys=[question], same for the answer
    nested = write(tmp_path / "nested.parquet", [{"extra_info": {"question": "1+1?", "answer": "2"}}])
    sft = SFTConfig(prompt_key="extra_info", prompt_dict_keys=("question",), response_key="extra_info",
                    response_dict_keys=("answer",))
    assert conversations(nested, sft) == [([{"role": "user", "content": "1+1?"},
                                            {"role": "assistant", "content": "2"}], None)]
    # verl's plain SFT parquet: string prompt + response columns
    plain = write(tmp_path / "plain.parquet", [{"prompt": "1+1?", "response": "2"}])
    samples = build_samples([plain], tok, SFTConfig()).samples
    ids = template_ids(tok, [{"role": "user", "content": "1+1?"}, {"role": "assistant", "content": "2"}])
    assert samples[0].input_ids.tolist() == ids
    assert assistant_text(tok, ids, samples[0].loss_mask.tolist()) == ["2<|im_end|>"]
    # multi-turn: a messages column (tool-call arguments as JSON text, as verl's data often has them)
    chat = [{"role": "user", "content": "add"},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
                                                                 "function": {"name": "add", "arguments": '{"a": 1}'}}]},
            {"role": "tool", "content": "1"}, {"role": "assistant", "content": "1"}]
    multi = tmp_path / "multi.jsonl"
    multi.write_text(json.dumps({"messages": chat, "tools": TOOLS}) + "\n")
    [(messages, tools)] = conversations(multi, SFTConfig())
    assert tools == TOOLS and messages[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}


def test_bad_data_is_one_clear_error(tmp_path, tok):
    rl_only = write(tmp_path / "train.parquet", [{"prompt": [{"role": "user", "content": "q"}], "data_source": "x"}])
    with pytest.raises(DataError, match="no 'response' column and no 'messages' column.*--sft"):
        build_samples([rl_only], tok, SFTConfig())
    long = write(tmp_path / "long.parquet", [{"prompt": "q", "response": "a" * 300}])
    with pytest.raises(DataError, match="row 0 is .* tokens, over sft.max_length = 64"):
        build_samples([long], tok, SFTConfig(max_length=64))
    cut = build_samples([long], tok, SFTConfig(max_length=64, truncation="right"))
    assert cut.truncated == 1 and len(cut.samples[0].input_ids) == 64
