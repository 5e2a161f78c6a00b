"""Bad input never disappears silently: each case is a one-line error (exit 3) or a counted skip."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from rlctl.cli.main import main
from rlctl.errors import DataError
from rlctl.tasks.prep import PrepOptions, prepare

GOOD = {"question": "What is 2+2?", "answer": "2+2=4\n#### 4"}


def lines(path: Path, items) -> Path:
    """Write raw lines (bytes or JSON-able objects) to `path`."""
    out = b""
    for item in items:
        out += (item if isinstance(item, bytes) else json.dumps(item).encode()) + b"\n"
    path.write_bytes(out)
    return path


def prep(kind, src, tmp_path, **kw):
    return prepare(kind, PrepOptions(source=str(src), out=tmp_path / "out", **kw))


def assert_fails_then_skips(kind, src, tmp_path, message, skip_kind, skipped=1, **kw):
    """fail mode: one DataError mentioning `message`, nothing written; skip mode: counted under `skip_kind`."""
    with pytest.raises(DataError) as err:
        prep(kind, src, tmp_path, **kw)
    assert message in str(err.value) and "--on-error skip" in str(err.value)
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()
    report = prep(kind, src, tmp_path, on_error="skip", **kw)
    assert report["splits"]["train"]["skipped"] == {skip_kind: skipped}
    return report


def test_malformed_json_line_reports_file_and_line(tmp_path):
    src = lines(tmp_path / "train.jsonl", [GOOD, {**GOOD, "question": "q2"}, b'{"question": "broken",'])
    report = assert_fails_then_skips("gsm8k", src, tmp_path, "train.jsonl:3: malformed JSON", "malformed JSON")
    assert report["splits"]["train"]["rows"] == 2
    assert report["skipped_examples"][0].startswith("train.jsonl:3:")


def test_missing_and_empty_question_or_answer(tmp_path):
    src = lines(tmp_path / "train.jsonl", [GOOD, {"answer": "#### 1"}, {"question": "  ", "answer": "#### 1"},
                                           {"question": "q", "answer": ""}])
    with pytest.raises(DataError, match=r"3 bad row\(s\).*train.jsonl:2: no 'question' field"):
        prep("gsm8k", src, tmp_path)
    report = prep("gsm8k", src, tmp_path, on_error="skip")
    assert report["splits"]["train"]["skipped"] == {"missing question": 1, "empty question": 1, "empty answer": 1}


def test_gsm8k_answer_without_hashes(tmp_path):
    src = lines(tmp_path / "train.jsonl", [GOOD, {"question": "q", "answer": "the answer is 4"}])
    assert_fails_then_skips("gsm8k", src, tmp_path, "train.jsonl:2: answer has no '#### <number>' line",
                            "no #### answer")


def test_math_solution_without_boxed(tmp_path):
    src = lines(tmp_path / "train.jsonl", [{"problem": "p", "solution": "\\boxed{1}"},
                                           {"problem": "p2", "solution": "it is 2"},
                                           {"problem": "p3", "solution": "\\boxed{}"}])
    assert_fails_then_skips("math", src, tmp_path, "train.jsonl:2: solution has no complete \\boxed",
                            "no \\boxed answer", skipped=2)


def test_non_utf8_bytes_in_jsonl_and_csv(tmp_path):
    src = lines(tmp_path / "train.jsonl", [GOOD, b'{"question": "caf\xe9", "answer": "#### 1"}'])
    assert_fails_then_skips("gsm8k", src, tmp_path, "train.jsonl:2: not valid UTF-8 (byte 0xe9", "not UTF-8")
    csv_dir = tmp_path / "csv"
    csv_dir.mkdir()
    (csv_dir / "d.csv").write_bytes(b"question,answer\nok,1\ncaf\xe9,2\n")
    assert_fails_then_skips("csv", csv_dir / "d.csv", csv_dir, "d.csv:3: not valid UTF-8", "not UTF-8")


def test_empty_files(tmp_path):
    (tmp_path / "train.jsonl").write_bytes(b"")
    with pytest.raises(DataError, match="is empty"):
        prep("gsm8k", tmp_path / "train.jsonl", tmp_path)
    (tmp_path / "blank.jsonl").write_text("\n\n")
    with pytest.raises(DataError, match="holds no rows"):
        prep("jsonl", tmp_path / "blank.jsonl", tmp_path)
    (tmp_path / "h.csv").write_text("question,answer\n")
    with pytest.raises(DataError, match="holds no rows"):
        prep("csv", tmp_path / "h.csv", tmp_path)


def test_duplicates_are_dropped_and_counted(tmp_path):
    src = lines(tmp_path / "train.jsonl", [GOOD, {"question": "other", "answer": "#### 1"}, GOOD, GOOD])
    report = prep("gsm8k", src, tmp_path)  # not an error even in fail mode: nothing is wrong with the row
    assert report["splits"]["train"]["rows"] == 2
    assert report["splits"]["train"]["skipped"] == {"duplicate": 2}
    assert report["skipped_examples"][0] == "train.jsonl:3: duplicate of train.jsonl:1"
    assert pq.read_table(tmp_path / "out/train.parquet").num_rows == 2


def test_csv_with_the_wrong_header(tmp_path, capsys):
    (tmp_path / "d.csv").write_text("prompt,response\nhi,there\n")
    with pytest.raises(DataError, match=r"has no column 'question' \(columns: prompt, response\).*--prompt-col"):
        prep("csv", tmp_path / "d.csv", tmp_path)
    assert main(["data", "prep", "csv", "--source", str(tmp_path / "d.csv"), "--out", str(tmp_path / "o"),
                 "--answer-col", "response"]) == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no column 'question'" in err


def test_csv_row_with_the_wrong_field_count(tmp_path):
    (tmp_path / "d.csv").write_text("question,answer\nok,1\nbad,2,extra\n")
    assert_fails_then_skips("csv", tmp_path / "d.csv", tmp_path, "d.csv:3: 3 fields, the header has 2",
                            "wrong field count")


def test_every_row_bad_is_an_error_even_when_skipping(tmp_path):
    src = lines(tmp_path / "train.jsonl", [{"question": "q", "answer": "no hashes"}])
    with pytest.raises(DataError, match="no usable rows"):
        prep("gsm8k", src, tmp_path, on_error="skip")


def test_first_few_offenders_are_shown_and_the_rest_counted(tmp_path):
    src = lines(tmp_path / "train.jsonl", [GOOD] + [b"not json"] * 5)
    with pytest.raises(DataError) as err:
        prep("gsm8k", src, tmp_path)
    msg = str(err.value)
    assert msg.startswith("5 bad row(s)") and "train.jsonl:2:" in msg and "train.jsonl:4:" in msg
    assert "train.jsonl:5:" not in msg and "(and 2 more)" in msg


def test_missing_source_and_unknown_files(tmp_path):
    with pytest.raises(DataError, match="no such file"):
        prep("jsonl", tmp_path / "nope.jsonl", tmp_path)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(DataError, match="no .jsonl/.json files named after a split"):
        prep("jsonl", tmp_path, tmp_path)


def test_parquet_source_that_is_not_parquet(tmp_path):
    (tmp_path / "train.parquet").write_text("definitely not parquet")
    with pytest.raises(DataError, match="not a readable parquet file"):
        prep("parquet", tmp_path / "train.parquet", tmp_path)
