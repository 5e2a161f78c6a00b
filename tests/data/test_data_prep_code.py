"""`rlctl data prep code` (users' coding problems) and `code-synthetic`, scored by the real sandbox."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from rlctl.data.schema import validate_table
from rlctl.errors import DataError, UsageError
from rlctl.rewards import default_compute_score
from rlctl.tasks.prep import PrepOptions, prepare


def read(path) -> list[dict]:
    table = pq.read_table(path)
    validate_table(table)
    return table.to_pylist()


@pytest.mark.slow
def test_user_problems_keep_verl_ground_truth_and_score(tmp_path):
    src = tmp_path / "problems.jsonl"
    src.write_text(
        json.dumps({"question": "Print a+b.", "tests": {"inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]}})
        + "\n" + json.dumps({"question": "Echo.", "tests": json.dumps({"inputs": ["hi\n"], "outputs": ["hi\n"]})})
        + "\n")
    report = prepare("code", PrepOptions(source=str(src), out=tmp_path / "o"))
    rows = read(tmp_path / "o/train.parquet")
    assert report["data_source"] == "rlctl/code" and [r["ability"] for r in rows] == ["code", "code"]
    truth = json.loads(rows[0]["reward_model"]["ground_truth"])
    assert truth == {"inputs": ["1 2\n", "5 5\n"], "outputs": ["3\n", "10\n"]}
    assert rows[0]["prompt"][0]["content"].startswith("Print a+b. Write a Python program")
    solution = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
    assert default_compute_score(rows[0]["data_source"], solution, rows[0]["reward_model"]["ground_truth"])[
        "score"] == 1.0


def test_bad_tests_are_data_errors_or_skipped(tmp_path):
    src = tmp_path / "bad.jsonl"
    src.write_text(json.dumps({"question": "q", "tests": {"inputs": ["1"]}}) + "\n"
                   + json.dumps({"question": "ok", "tests": {"inputs": ["1"], "outputs": ["1"]}}) + "\n")
    with pytest.raises(DataError, match="bad row"):
        prepare("code", PrepOptions(source=str(src), out=tmp_path / "o"))
    report = prepare("code", PrepOptions(source=str(src), out=tmp_path / "o", on_error="skip"))
    assert report["splits"]["train"]["rows"] == 1 and report["splits"]["train"]["skipped"] == {"bad tests": 1}
    with pytest.raises(UsageError, match="code-synthetic"):
        prepare("code", PrepOptions(out=tmp_path / "x"))
    with pytest.raises(UsageError, match="offline"):
        prepare("code-synthetic", PrepOptions(source=str(src), out=tmp_path / "x"))


@pytest.mark.slow
def test_synthetic_task_is_seeded_disjoint_and_solvable(tmp_path):
    prepare("code-synthetic", PrepOptions(out=tmp_path / "a", seed=1))
    prepare("code-synthetic", PrepOptions(out=tmp_path / "b", seed=1))
    train, test = read(tmp_path / "a/train.parquet"), read(tmp_path / "a/test.parquet")
    assert (len(train), len(test)) == (90, 10) and train == read(tmp_path / "b/train.parquet")
    assert not {r["prompt"][0]["content"] for r in train} & {r["prompt"][0]["content"] for r in test}
    row = next(r for r in train if "their sum plus 3." in r["prompt"][0]["content"])
    truth = row["reward_model"]["ground_truth"]
    right = default_compute_score("rlctl/code", "```python\na, b = map(int, input().split())\nprint(a + b + 3)\n```",
                                  truth, format_score=0.1)
    bare = default_compute_score("rlctl/code", "a, b = map(int, input().split())\nprint(a + b + 3)", truth)
    runs_wrong = default_compute_score("rlctl/code", "print(0)", truth, format_score=0.1)
    assert right["score"] == 1.0 and bare["score"] == 1.0 and runs_wrong["score"] == pytest.approx(0.1)
    assert default_compute_score("apps", "print(0)", truth, format_score=0.1)["score"] == 0.0   # verl: run whole, no credit
