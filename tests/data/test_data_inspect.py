"""`rlctl data inspect`: schema errors name the exact column; token lengths match the tokenizer."""

from __future__ import annotations

import json
import math

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlctl.cli.main import main
from rlctl.data.inspect import histogram, inspect_file, percentile
from rlctl.errors import DataError
from rlctl.tasks.prep import PrepOptions, prepare

PROMPT = [{"role": "user", "content": "hi"}]
GOOD = {"data_source": ["s"], "prompt": [PROMPT], "ability": ["a"],
        "reward_model": [{"style": "rule", "ground_truth": "1"}], "extra_info": [{"split": "train", "index": 0}]}


@pytest.fixture(scope="module")
def arith_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("arith")
    prepare("arith", PrepOptions(out=out))
    return out


def write(path, columns: dict):
    pq.write_table(pa.table(columns), path)
    return path


def test_inspect_counts_sources_and_samples(arith_dir):
    report = inspect_file(arith_dir / "train.parquet", samples=2)
    assert report["rows"] == 360 and report["data_sources"] == {"rlctl/arith": 360}
    assert report["splits"] == {"train": 360} and report["empty_ground_truth"] == 0
    assert len(report["samples"]) == 2 and report["samples"][0]["roles"] == ["user"]
    assert "prompt_tokens" not in report


def test_prompt_lengths_match_the_chat_template(arith_dir, tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rows = pq.read_table(arith_dir / "train.parquet").to_pylist()
    expected = [len(tok.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=True)["input_ids"])
                for r in rows]
    # byte-level tokenizer: every byte of the content is a token, plus 19 for the ChatML wrapping
    assert expected == [len(r["prompt"][0]["content"].encode()) + 19 for r in rows]
    limit = 56
    report = inspect_file(arith_dir / "train.parquet", model=str(tiny_model_dir), max_prompt_length=limit)
    tokens = report["prompt_tokens"]
    assert (tokens["min"], tokens["max"]) == (min(expected), max(expected))
    assert tokens["over_limit"] == sum(n > limit for n in expected) > 0
    assert sum(b["count"] for b in tokens["histogram"]) == len(rows)
    assert tokens["percentiles"]["p50"] == sorted(expected)[math.ceil(len(expected) / 2) - 1]  # nearest rank


def test_percentile_and_histogram_by_hand():
    values = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert [percentile(values, q) for q in (10, 50, 90, 99, 100)] == [1, 5, 9, 10, 10]
    assert histogram([3, 3, 3]) == [{"lo": 3, "hi": 3, "count": 3}]
    bins = histogram(list(range(0, 100)), bins=4)
    assert [(b["lo"], b["hi"], b["count"]) for b in bins] == [(0, 24, 25), (25, 49, 25), (50, 74, 25), (75, 99, 25)]


@pytest.mark.parametrize("change, column", [
    ({"reward_model": None}, "'reward_model' is missing"),
    ({"prompt": pa.array(["just text"])}, "column 'prompt' is string"),
    ({"data_source": pa.array([3])}, "column 'data_source' is int64"),
    ({"reward_model": pa.array([{"style": "rule", "ground_truth": 1}])}, "'reward_model.ground_truth' is int64"),
    ({"reward_model": pa.array([{"style": "rule"}])}, "'reward_model.ground_truth' is missing"),
    ({"prompt": pa.array([[{"role": "user", "text": "hi"}]])}, "'prompt[].content' is missing"),
    ({"extra_info": pa.array([{"split": "train", "index": "zero"}])}, "'extra_info.index' is string"),
    ({"data_source": pa.array([None], pa.string())}, "'data_source' is null or empty in 1 row(s) (first: row 0)"),
    ({"prompt": pa.array([[]], pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())])))},
     "'prompt' is null or empty"),
])
def test_schema_errors_name_the_column(tmp_path, change, column, capsys):
    columns = {k: v for k, v in {**GOOD, **change}.items() if v is not None}
    path = write(tmp_path / "bad.parquet", columns)
    with pytest.raises(DataError) as err:
        inspect_file(path)
    assert column in str(err.value)
    assert main(["data", "inspect", str(path)]) == 3
    assert column in capsys.readouterr().err


def test_every_schema_problem_is_reported_at_once(tmp_path):
    path = write(tmp_path / "two.parquet", {"data_source": pa.array([1]), "prompt": pa.array(["x"])})
    with pytest.raises(DataError) as err:
        inspect_file(path)
    msg = str(err.value)
    assert "'reward_model' is missing" in msg and "'data_source' is int64" in msg and "'prompt' is string" in msg


def test_a_file_that_is_not_parquet_exits_3(tmp_path, capsys):
    (tmp_path / "x.parquet").write_text("hello")
    assert main(["data", "inspect", str(tmp_path / "x.parquet")]) == 3
    assert "not a readable parquet file" in capsys.readouterr().err
    assert main(["data", "inspect", str(tmp_path / "missing.parquet")]) == 3


def test_a_folder_is_not_a_parquet_file(arith_dir, tmp_path, capsys):
    assert main(["data", "inspect", str(arith_dir)]) == 3
    err = capsys.readouterr().err
    assert f"{arith_dir} is a folder, not a parquet file" in err and "does not exist" not in err
    assert f"{arith_dir / 'test.parquet'}" in err  # the files it holds, to pass instead
    assert main(["data", "inspect", str(tmp_path)]) == 3
    assert "pass a .parquet file" in capsys.readouterr().err


def test_verl_style_rows_without_optional_columns_pass(tmp_path):
    path = write(tmp_path / "verl.parquet", {k: GOOD[k] for k in ("data_source", "prompt", "reward_model")})
    assert inspect_file(path)["rows"] == 1


def test_cli_inspect_text_and_json(arith_dir, tiny_model_dir, capsys):
    assert main(["data", "inspect", str(arith_dir / "test.parquet"), "--model", str(tiny_model_dir),
                 "--max-prompt-length", "64", "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["rows"] == 40 and report["prompt_tokens"]["over_limit"] == 0
    assert main(["data", "inspect", str(arith_dir / "test.parquet"), "--model", str(tiny_model_dir)]) == 0
    out = capsys.readouterr().out
    assert "schema ok" in out and "rlctl/arith (40)" in out and "█" in out
    assert main(["data", "inspect", str(arith_dir / "test.parquet"), "--max-prompt-length", "8"]) == 2
    assert main(["data", "inspect", str(arith_dir / "test.parquet"), "--model", str(arith_dir / "nomodel")]) == 3
