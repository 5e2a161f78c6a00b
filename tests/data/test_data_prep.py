"""`rlctl data prep` on real files: GSM8K (the in-repo sample; the full files of ../shared when present), MATH
layouts, the arith task, users' own files."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlctl.cli.main import main
from rlctl.data.dataset import load_rows, prompt_token_lengths
from rlctl.data.schema import validate_table
from rlctl.errors import DataError, UsageError
from rlctl.tasks.gsm8k import INSTRUCTION as GSM8K_INSTRUCTION
from rlctl.tasks.math import INSTRUCTION as MATH_INSTRUCTION
from rlctl.tasks.prep import PrepOptions, prepare


def write_jsonl(path: Path, records) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def read(path) -> list[dict]:
    table = pq.read_table(path)
    validate_table(table)
    return table.to_pylist()


@pytest.fixture(scope="module")
def gsm8k_prepared(gsm8k_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("gsm8k_out")
    report = prepare("gsm8k", PrepOptions(source=str(gsm8k_dir), out=out))
    return out, report


def assert_rows_match_verl_preprocessing(source: Path, out: Path, report: dict) -> None:
    originals = {s: [json.loads(line) for line in (source / f"{s}.jsonl").read_text().splitlines()]
                 for s in ("train", "test")}
    assert {s: i["rows"] for s, i in report["splits"].items()} == {s: len(o) for s, o in originals.items()}
    for split, records in originals.items():
        rows = read(out / f"{split}.parquet")
        assert len(rows) == len(records)
        for i, (row, orig) in enumerate(zip(rows, records)):
            assert row["data_source"] == "openai/gsm8k" and row["ability"] == "math"
            assert row["prompt"] == [{"role": "user", "content": orig["question"] + " " + GSM8K_INSTRUCTION}]
            # verl: the text after "#### " with commas removed
            assert row["reward_model"] == {"style": "rule",
                                           "ground_truth": orig["answer"].split("#### ")[-1].replace(",", "")}
            assert row["extra_info"] == {"split": split, "index": i, "question": orig["question"],
                                         "answer": orig["answer"]}


def test_gsm8k_sample_rows_match_verl_preprocessing(gsm8k_prepared, gsm8k_dir):
    out, report = gsm8k_prepared
    assert {s: i["rows"] for s, i in report["splits"].items()} == {"train": 48, "test": 32}
    assert_rows_match_verl_preprocessing(gsm8k_dir, out, report)
    # the sample keeps two answers with thousands separators, so the comma rule is exercised
    assert {"1080", "850000"} <= {r["reward_model"]["ground_truth"] for r in read(out / "train.parquet")}


def test_gsm8k_full_files_match_verl_preprocessing(gsm8k_full_dir, tmp_path):
    report = prepare("gsm8k", PrepOptions(source=str(gsm8k_full_dir), out=tmp_path))
    assert {s: i["rows"] for s, i in report["splits"].items()} == {"train": 7473, "test": 1319}
    assert_rows_match_verl_preprocessing(gsm8k_full_dir, tmp_path, report)


def test_gsm8k_first_row_by_hand(gsm8k_prepared):
    first = read(gsm8k_prepared[0] / "train.parquet")[0]
    assert first["prompt"][0]["content"].startswith("Natalia sold clips to 48 of her friends")
    assert first["prompt"][0]["content"].endswith('output the final answer after "####".')
    assert first["reward_model"]["ground_truth"] == "72"


def test_gsm8k_from_parquet_files_gives_the_same_rows(gsm8k_prepared, gsm8k_dir, tmp_path):
    src = tmp_path / "hub_layout" / "main"
    src.mkdir(parents=True)
    for split in ("train", "test"):
        records = [json.loads(line) for line in (gsm8k_dir / f"{split}.jsonl").read_text().splitlines()]
        pq.write_table(pa.Table.from_pylist(records), src / f"{split}-00000-of-00001.parquet")
    prepare("gsm8k", PrepOptions(source=str(tmp_path / "hub_layout"), out=tmp_path / "out"))
    for split in ("train", "test"):
        assert read(tmp_path / "out" / f"{split}.parquet") == read(gsm8k_prepared[0] / f"{split}.parquet")


def test_gsm8k_offline_hub_says_how_to_use_source(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # conftest sets it too; be explicit about what we test
    with pytest.raises(DataError, match="--source PATH"):
        prepare("gsm8k", PrepOptions(out=tmp_path / "o"))
    assert main(["data", "prep", "gsm8k", "--out", str(tmp_path / "o")]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "openai/gsm8k" in err and "--source" in err
    assert not (tmp_path / "o").exists()


def test_math_folder_of_jsonl_and_original_layout(tmp_path):
    records = [
        {"problem": "Simplify $\\frac{2}{4}$.", "solution": "It is $\\boxed{\\frac{1}{2}}$."},
        {"problem": "What is $1+1$?", "solution": "First \\boxed{3}? No: $\\boxed{2}$."},
        {"problem": "Expand.", "solution": "We get $\\boxed{x^{2}+2x+1}$."},
    ]
    write_jsonl(tmp_path / "jsonl" / "train.jsonl", records[:2])
    write_jsonl(tmp_path / "jsonl" / "test.jsonl", records[2:])
    for i, rec in enumerate(records):  # the original Hendrycks layout: split/subject/N.json
        path = tmp_path / "orig" / ("train" if i < 2 else "test") / "algebra" / f"{i}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**rec, "level": "Level 1", "type": "Algebra"}))
    for layout in ("jsonl", "orig"):
        prepare("math", PrepOptions(source=str(tmp_path / layout), out=tmp_path / f"out_{layout}"))
        train, test = read(tmp_path / f"out_{layout}/train.parquet"), read(tmp_path / f"out_{layout}/test.parquet")
        assert [r["reward_model"]["ground_truth"] for r in train + test] == ["\\frac{1}{2}", "2", "x^{2}+2x+1"]
        assert train[0]["data_source"] == "DigitalLearningGmbH/MATH-lighteval"
        assert train[0]["prompt"][0]["content"] == records[0]["problem"] + " " + MATH_INSTRUCTION


def test_arith_is_seeded_short_and_disjoint(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    prepare("arith", PrepOptions(out=tmp_path / "a", seed=3))
    prepare("synthetic", PrepOptions(out=tmp_path / "b", seed=3))
    prepare("arith", PrepOptions(out=tmp_path / "c", seed=4))
    train, test = read(tmp_path / "a/train.parquet"), read(tmp_path / "a/test.parquet")
    assert (len(train), len(test)) == (360, 40)
    assert train == read(tmp_path / "b/train.parquet") and train != read(tmp_path / "c/train.parquet")
    assert not {r["prompt"][0]["content"] for r in train} & {r["prompt"][0]["content"] for r in test}
    for row in train + test:
        a, b = row["prompt"][0]["content"].removeprefix("What is ").split("?")[0].split("+")
        assert row["reward_model"]["ground_truth"] == str(int(a) + int(b))
        assert row["data_source"] == "rlctl/arith"
    lengths = prompt_token_lengths([r["prompt"] for r in train], AutoTokenizer.from_pretrained(tiny_model_dir))
    assert max(lengths) < 64


def test_user_jsonl_with_column_mapping_system_and_instruction(tmp_path):
    src = write_jsonl(tmp_path / "qa.jsonl", [{"q": "Capital of France?", "a": " Paris "},
                                              {"q": "2+2?", "a": 4}])
    report = prepare("jsonl", PrepOptions(source=str(src), out=tmp_path / "o", prompt_col="q", answer_col="a",
                                          system="Be brief.", instruction="One word."))
    rows = read(tmp_path / "o/train.parquet")
    assert report["data_source"] == "qa" and list(report["splits"]) == ["train"]
    assert rows[0]["prompt"] == [{"role": "system", "content": "Be brief."},
                                 {"role": "user", "content": "Capital of France? One word."}]
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["Paris", "4"]


def test_user_csv_and_parquet_with_data_source(tmp_path):
    (tmp_path / "d.csv").write_text('question,answer\n"Say ""hi""",hi\nSum 1 and 2,3\n')
    prepare("csv", PrepOptions(source=str(tmp_path / "d.csv"), out=tmp_path / "c", data_source="openai/gsm8k"))
    rows = read(tmp_path / "c/train.parquet")
    assert [r["prompt"][0]["content"] for r in rows] == ['Say "hi"', "Sum 1 and 2"]
    assert {r["data_source"] for r in rows} == {"openai/gsm8k"}
    pq.write_table(pa.table({"prompt_text": ["a?", "b?"], "gold": ["1", "2"]}), tmp_path / "u.parquet")
    prepare("parquet", PrepOptions(source=str(tmp_path / "u.parquet"), out=tmp_path / "p",
                                   prompt_col="prompt_text", answer_col="gold"))
    assert [r["reward_model"]["ground_truth"] for r in read(tmp_path / "p/train.parquet")] == ["1", "2"]


def test_val_fraction_limit_and_splits(tmp_path):
    src = write_jsonl(tmp_path / "many.jsonl", [{"question": f"q{i}", "answer": str(i)} for i in range(100)])
    report = prepare("jsonl", PrepOptions(source=str(src), out=tmp_path / "v", val_fraction=0.2, seed=1))
    train, test = read(tmp_path / "v/train.parquet"), read(tmp_path / "v/test.parquet")
    assert (len(train), len(test)) == (80, 20)
    assert {r["extra_info"]["split"] for r in test} == {"test"}
    assert sorted(r["extra_info"]["index"] for r in train + test) == list(range(100))
    assert report["splits"]["test"]["rows"] == 20
    prepare("jsonl", PrepOptions(source=str(src), out=tmp_path / "w", val_fraction=0.2, seed=1))
    assert read(tmp_path / "w/test.parquet") == test and read(tmp_path / "w/train.parquet") == train
    limited = prepare("jsonl", PrepOptions(source=str(src), out=tmp_path / "l", val_fraction=0.2, seed=1,
                                           limit=5, splits=("test",)))
    assert list(limited["splits"]) == ["test"] and limited["splits"]["test"]["over_limit"] == 15
    assert read(tmp_path / "l/test.parquet") == test[:5] and not (tmp_path / "l/train.parquet").exists()
    with pytest.raises(UsageError, match="split.*validation.*found: train, test"):
        prepare("jsonl", PrepOptions(source=str(src), out=tmp_path / "x", splits=("validation",), val_fraction=0.2))


def test_default_out_refuses_overwrite_and_leaves_no_temp_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    prepare("arith", PrepOptions())
    assert sorted(p.name for p in (tmp_path / "data/arith").iterdir()) == ["test.parquet", "train.parquet"]
    with pytest.raises(UsageError, match="--force"):
        prepare("arith", PrepOptions(seed=1))
    prepare("arith", PrepOptions(seed=1, force=True))
    assert sorted(p.name for p in (tmp_path / "data/arith").iterdir()) == ["test.parquet", "train.parquet"]


def test_cli_prep_json_and_text(tmp_path, capsys):
    assert main(["data", "prep", "arith", "--out", str(tmp_path / "j"), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["splits"]["train"]["rows"] == 360 and report["data_source"] == "rlctl/arith"
    assert main(["data", "prep", "arith", "--out", str(tmp_path / "t"), "--limit", "10"]) == 0
    text = capsys.readouterr().out
    assert "train" in text and "past --limit" in text
    assert len(load_rows([tmp_path / "t/train.parquet"])) == 10
    assert main(["data", "prep", "nosuch", "--out", str(tmp_path / "n")]) == 2
    assert "unknown source" in capsys.readouterr().err


def test_cli_prep_prints_user_text_as_written(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # a short --out keeps the table title on one line
    write_jsonl(tmp_path / "d.jsonl", [{"question": "q", "answer": "a"}])
    assert main(["data", "prep", "jsonl", "--source", "d.jsonl", "--out", "o[1]", "--data-source", "[/x]"]) == 0
    out = capsys.readouterr().out
    assert "-> o[1]  (data_source [/x])" in out and "o[1]/train.parquet" in out


def assert_usage_error(argv, capsys, *words):
    """exit 2 with one line on stderr that holds every word."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for word in words:
        assert word in err, err


def test_unwritable_out_is_a_usage_error_and_writes_nothing(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("x")
    prep = ["data", "prep", "arith", "--out"]
    assert_usage_error([*prep, str(afile)], capsys, f"cannot write into {afile}: it is a file", "--out")
    assert_usage_error([*prep, str(afile / "sub")], capsys, f"cannot create folder {afile / 'sub'}",
                       "Not a directory", "--out")
    assert afile.read_text() == "x"
    if Path("/proc").is_dir():
        assert_usage_error([*prep, "/proc/rlctl-out"], capsys, "cannot create folder /proc/rlctl-out", "--out")
    blocked = tmp_path / "blocked"
    (blocked / "train.parquet").mkdir(parents=True)
    assert_usage_error([*prep, str(blocked), "--force"], capsys, f"cannot write {blocked / 'train.parquet'}",
                       "folder")
    assert sorted(p.name for p in blocked.iterdir()) == ["train.parquet"]  # test.parquet was not written either


def test_a_failed_write_changes_no_file_and_leaves_no_folder(tmp_path, monkeypatch):
    import rlctl.utils.atomic_files as writing

    prepare("arith", PrepOptions(out=tmp_path / "a", seed=0))
    before = {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir()}
    real, calls = writing.atomic_write_bytes, []

    def full_disk_on_second_file(path, data):
        calls.append(path)
        if len(calls) % 2 == 0:
            raise OSError(28, "No space left on device")
        real(path, data)

    monkeypatch.setattr(writing, "atomic_write_bytes", full_disk_on_second_file)
    with pytest.raises(UsageError, match=r"cannot write .*test.parquet \(No space left on device\)"):
        prepare("arith", PrepOptions(out=tmp_path / "a", seed=1, force=True))
    assert {p.name: p.read_bytes() for p in (tmp_path / "a").iterdir()} == before
    with pytest.raises(UsageError, match="No space left"):
        prepare("arith", PrepOptions(out=tmp_path / "new" / "deeper"))
    assert not (tmp_path / "new").exists()


def test_usage_mistakes_exit_2_and_data_problems_exit_3(tmp_path, gsm8k_dir, capsys):
    out = tmp_path / "o"
    assert_usage_error(["data", "prep", "jsonl", "--out", str(out)], capsys, "needs --source PATH")
    assert_usage_error(["data", "prep", "gsm8k", "--source", str(gsm8k_dir), "--splits", "tset", "--out", str(out)],
                       capsys, "tset", "found: train, test")
    assert not out.exists()
    assert main(["data", "prep", "jsonl", "--source", str(tmp_path / "nope.jsonl"), "--out", str(out)]) == 3


def test_written_files_have_the_usual_permissions(tmp_path):
    """Atomic writes go through mkstemp (0600); the result must look like a plain open(): 0666 - umask."""
    import os

    from rlctl.utils.atomic_files import _UMASK, atomic_write_text

    atomic_write_text(tmp_path / "a.txt", "x")
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o666 & ~_UMASK
    os.chmod(tmp_path / "a.txt", 0o640)
    atomic_write_text(tmp_path / "a.txt", "y")                    # a replaced file keeps its mode
    assert (tmp_path / "a.txt").stat().st_mode & 0o777 == 0o640
