"""`rlctl data prep calc-tools`: RL rows the built-in reward scores, and SFT transcripts that the chat
template renders and the hermes parser reads back, all right by construction."""

from __future__ import annotations

import json

import pytest

from rlctl.data.dataset import load_rows
from rlctl.models.tiny import build_tokenizer
from rlctl.multiturn.builtin_tools import calculator
from rlctl.multiturn.formats import ToolCall, parse_tool_calls
from rlctl.rewards.builtin import default_compute_score, resolve_builtin
from rlctl.tasks.calc_tools import DATA_SOURCE, DIRECT_EVERY
from rlctl.tasks.prep import PrepOptions, prepare

OPS = {"+": lambda a, b: a + b, "*": lambda a, b: a * b}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    out = tmp_path_factory.mktemp("calc_tools")
    report = prepare("calc-tools", PrepOptions(out=out))
    return report, {s: load_rows(out / f"{s}.parquet") for s in ("train", "test")}  # load_rows validates


def _operands(question: str) -> tuple[int, str, int]:
    a, op, b = question.removeprefix("What is ").split("?")[0].split()
    return int(a), op, int(b)


def test_rows_validate_and_the_splits_are_disjoint(prepared):
    report, rows = prepared
    assert report["data_source"] == DATA_SOURCE
    assert {s: i["rows"] for s, i in report["splits"].items()} == {"train": 900, "test": 100}
    questions = {s: {r["prompt"][0]["content"] for r in rs} for s, rs in rows.items()}
    assert not questions["train"] & questions["test"] and len(questions["train"]) == 900
    ops = [_operands(r["prompt"][0]["content"])[1] for r in rows["train"] + rows["test"]]
    assert ops.count("+") == ops.count("*") == 500


def test_ground_truth_is_the_calculator_on_the_question_and_exact(prepared):
    _, rows = prepared
    for row in rows["train"] + rows["test"]:
        a, op, b = _operands(row["prompt"][0]["content"])
        truth = row["reward_model"]["ground_truth"]
        assert truth == calculator(f"{a} {op} {b}") == str(OPS[op](a, b)) and len(truth) == 5
        assert row["prompt"] == [{"role": "user", "content": row["messages"][0]["content"]}]


def test_transcripts_render_with_the_template_and_their_calls_parse_back(prepared):
    _, rows = prepared
    tok = build_tokenizer()
    direct = [row for row in rows["train"] if len(row["messages"]) == 2]
    assert len(direct) == len(rows["train"]) // DIRECT_EVERY   # one transcript in DIRECT_EVERY skips the tool
    for row in direct:
        assert row["messages"][1] == {"role": "assistant", "content": row["reward_model"]["ground_truth"],
                                      "tool_calls": None, "tool_call_id": None, "name": None}
    for row in [row for row in rows["train"] if len(row["messages"]) == 4][:50]:
        tools, messages, truth = json.loads(row["tools"]), row["messages"], row["reward_model"]["ground_truth"]
        assert [t["function"]["name"] for t in tools] == ["calculator"]
        # the same tools block as a rollout that hands the template the function itself (tools=[calculator])
        assert tok.apply_chat_template(row["prompt"], tools=tools, tokenize=False) == \
            tok.apply_chat_template(row["prompt"], tools=[calculator], tokenize=False)
        text = tok.apply_chat_template(messages, tools=tools, tokenize=False)
        # the SFT transcript continues exactly the prompt an RL rollout starts from (same tools block)
        prompt = tok.apply_chat_template(row["prompt"], tools=tools, tokenize=False, add_generation_prompt=True)
        assert text.startswith(prompt) and "\ncalculator(expression): Evaluate arithmetic" in prompt
        first, rest = text[len(prompt):].split("<|im_end|>\n", 1)
        parsed = parse_tool_calls(first)
        a, op, b = _operands(messages[0]["content"])
        assert parsed.content == "" and parsed.errors == []
        assert parsed.calls == [ToolCall("calculator", {"expression": f"{a} {op} {b}"})]
        assert calculator(**parsed.calls[0].arguments) == messages[2]["content"] == truth
        assert rest == (f"<|im_start|>user\n<tool_response>\n{truth}\n</tool_response><|im_end|>\n"
                        f"<|im_start|>assistant\n{truth}<|im_end|>\n")
        # the built-in reward gives the transcript's answer full marks, read from text or from messages
        response = text[len(prompt):]
        for extra in (None, {"messages": messages}):
            assert default_compute_score(DATA_SOURCE, response, truth, extra) == \
                {"score": 1.0, "acc": 1.0, "tool_call": 1.0}
        decoded = tok.decode(tok(response, add_special_tokens=False)["input_ids"], skip_special_tokens=True)
        assert default_compute_score(DATA_SOURCE, decoded, truth)["acc"] == 1.0


@pytest.mark.parametrize("response, extra, expected", [
    ("178377", None, {"score": 1.0, "acc": 1.0, "tool_call": 0.0}),       # right without the tool is right
    ("1,783,77", None, {"score": 1.0, "acc": 1.0, "tool_call": 0.0}),     # commas dropped
    ("178378", None, {"score": 0.1, "acc": 0.0, "tool_call": 0.0}),       # a wrong number: format_score
    ("about 178377", None, {"score": 0.0, "acc": 0.0, "tool_call": 0.0}),  # strict: the number only
    # the model's last turn is a call that never got answered: no final answer
    ('<tool_call>\n{"name": "calculator", "arguments": {"expression": "4821 * 37"}}\n</tool_call>', None,
     {"score": 0.0, "acc": 0.0, "tool_call": 1.0}),
    # the answer in a tool response is not the model's answer
    ("<tool_call>\n{}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\n178377\n</tool_response>"
     "<|im_end|>\n<|im_start|>assistant\n17<|im_end|>", None, {"score": 0.1, "acc": 0.0, "tool_call": 1.0}),
    ("", {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "178377"},
                       {"role": "user", "content": "again?"}, {"role": "assistant", "content": "no"}]},
     {"score": 0.0, "acc": 0.0, "tool_call": 0.0}),                       # the last assistant turn counts
])
def test_reward_reads_only_the_final_answer(response, extra, expected):
    assert resolve_builtin("calc-tools")(DATA_SOURCE, response, "178377", extra, format_score=0.1) == expected


def test_the_cli_writes_the_task(tmp_path):
    from rlctl.cli.main import main

    assert main(["data", "prep", "calc-tools", "--out", str(tmp_path), "--limit", "5", "--format", "json"]) == 0
    assert len(load_rows(tmp_path / "train.parquet")) == 5


def test_the_reward_is_named_as_the_docs_write_it(tmp_path):
    from rlctl.rewards.custom import parse_spec

    spec = parse_spec("calc-tools", tmp_path)   # not a "file.py:function" spec: the built-in of that name
    assert spec.path is None and spec.fn_name == "calc-tools"
