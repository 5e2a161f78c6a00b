"""`rlctl data prep gsm8k --tools python`: GSM8K prompts for tool use (the grpo-gsm8k-python-tool recipe).

The rows are plain GSM8K rows (verl's user message, ground truth, data_source) with one system message
first that offers the tool and asks for `#### <number>`, so the built-in gsm8k reward scores them.
"""

from __future__ import annotations

import json

import pyarrow.parquet as pq

from rlctl.cli.main import main
from rlctl.data.schema import validate_table
from rlctl.tasks.gsm8k import score
from rlctl.tasks.prep import PrepOptions, prepare, tool_system_prompt


def rows(path) -> list[dict]:
    table = pq.read_table(path)
    validate_table(table)
    return table.to_pylist()


def test_gsm8k_python_rows_are_the_plain_rows_plus_a_system_message(gsm8k_dir, tmp_path, monkeypatch, capsys):
    plain = prepare("gsm8k", PrepOptions(source=str(gsm8k_dir), out=tmp_path / "plain"))
    monkeypatch.chdir(tmp_path)
    assert main(["data", "prep", "gsm8k", "--tools", "python", "--source", str(gsm8k_dir), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["out"] == "data/gsm8k-python" and report["data_source"] == "openai/gsm8k"
    assert any('tools = ["python"]' in note for note in report["notes"])
    system = {"role": "system", "content": tool_system_prompt("gsm8k", ("python",))}
    assert "`python` tool" in system["content"] and "`#### <number>`" in system["content"]
    for split in ("train", "test"):
        tool_rows = rows(tmp_path / "data" / "gsm8k-python" / f"{split}.parquet")
        plain_rows = rows(plain["splits"][split]["file"])
        assert len(tool_rows) == len(plain_rows) == report["splits"][split]["rows"]
        for tool_row, plain_row in zip(tool_rows, plain_rows):
            assert tool_row["prompt"] == [system, *plain_row["prompt"]]
            assert {k: v for k, v in tool_row.items() if k != "prompt"} == \
                   {k: v for k, v in plain_row.items() if k != "prompt"}
    # the format the system message asks for is the one the built-in reward reads
    truth = tool_rows[0]["reward_model"]["ground_truth"]
    assert score(f"The program printed {truth}.\n#### {truth}", truth)["score"] == 1.0


def test_math_and_two_tools_name_each_and_the_boxed_format(tmp_path):
    (tmp_path / "train.jsonl").write_text(json.dumps({"problem": "1+1?", "solution": "It is $\\boxed{2}$."}) + "\n")
    prepare("math", PrepOptions(source=str(tmp_path / "train.jsonl"), out=tmp_path / "o",
                                tools=("calculator", "python")))
    system = rows(tmp_path / "o" / "train.parquet")[0]["prompt"][0]
    assert system["role"] == "system"
    assert "`calculator` tool" in system["content"] and "`python` tool" in system["content"]
    assert "Use them" in system["content"] and "\\boxed{}" in system["content"]


def test_tool_mistakes_are_one_line_usage_errors(gsm8k_dir, tmp_path, capsys):
    from rlctl.config.schema import BUILTIN_TOOLS
    from rlctl.tasks.prep import TOOL_OFFERS

    assert sorted(TOOL_OFFERS) == sorted(BUILTIN_TOOLS)   # --tools offers exactly what a rollout can run
    prep = ["data", "prep", "gsm8k", "--source", str(gsm8k_dir), "--out", str(tmp_path / "o")]
    cases = [(["--tools", "pyhton"], "unknown tool(s) 'pyhton'", "python, calculator"),
             (["--tools", "python", "--sft"], "--tools with --sft", "no tool-use transcript"),
             (["--tools", "python", "--system", "Be brief."], "--system would replace it")]
    for extra, *words in cases:
        assert main([*prep, *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and all(w in err for w in words), err
    assert main(["data", "prep", "arith", "--tools", "python", "--out", str(tmp_path / "o")]) == 2
    assert "--tools is for gsm8k and math prompts, not arith" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_docs_quote_the_system_message_as_written():
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "data.md").read_text()
    quoted = text.split("For `gsm8k --tools python` the system message is", 1)[1].split("```text", 1)[1]
    assert " ".join(quoted.split("```", 1)[0].split()) == tool_system_prompt("gsm8k", ("python",))
