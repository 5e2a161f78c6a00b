"""`rlctl data prep dapo-math-17k / aime24 / aime25 / math-500 --source DIR` read each hub repo's own
layout (written here, a few rows each): DAPO-Math-17k's and AIME-2024's verl rows with their repeats
dropped and DAPO's prompt template kept, aime_2025's and MATH-500's problem/answer files; the prepared
rows score with verl's rewards for their data_source; offline without --source is one line, exit 3."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.dapo_rows import verl_rows

from rlctl.cli.main import main
from rlctl.rewards.builtin import default_compute_score
from rlctl.tasks.math_dapo import PROMPT_PREFIX, PROMPT_SUFFIX, dapo_prompt


def _rows(path):
    return pq.read_table(path).to_pylist()


def test_dapo_math_17k_drops_repeats_and_keeps_the_template(tmp_path, capsys):
    src = tmp_path / "DAPO-Math-17k"
    (src / "data").mkdir(parents=True)
    problems = [("What is 2+2?", "4"), ("Find $x$ if $x^2=9$ and $x>0$.", "3"), ("How many primes are below 10?", "4")]
    pq.write_table(pa.Table.from_pylist(verl_rows(problems, 4)), src / "data" / "dapo-math-17k.parquet")
    (src / "README.md").write_text("# DAPO-Math-17k\n")
    out = tmp_path / "out"
    assert main(["data", "prep", "dapo-math-17k", "--source", str(src), "--out", str(out), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["splits"]["train"]["rows"] == 3 and report["splits"]["train"]["skipped"] == {"duplicate": 9}
    rows = _rows(out / "train.parquet")
    assert [r["extra_info"]["question"] for r in rows] == [q for q, _ in problems]
    content = rows[1]["prompt"][0]["content"]
    assert content == PROMPT_PREFIX + problems[1][0] + PROMPT_SUFFIX and rows[1]["prompt"][0]["role"] == "user"
    assert {(r["data_source"], r["ability"]) for r in rows} == {("math_dapo", "MATH")}
    right = default_compute_score(rows[1]["data_source"], "x^2=9 so x=3.\nAnswer: 3", rows[1]["reward_model"]["ground_truth"])
    assert right == {"score": 1.0, "acc": 1.0}


def test_aime24_from_verl_rows_is_a_test_split(tmp_path):
    src = tmp_path / "AIME-2024"
    (src / "data").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(verl_rows([("Find the answer.", "204"), ("Another.", "25")], 32)),
                   src / "data" / "aime-2024.parquet")
    out = tmp_path / "aime24"
    assert main(["data", "prep", "aime24", "--source", str(src), "--out", str(out)]) == 0
    rows = _rows(out / "test.parquet")
    assert len(rows) == 2 and {r["data_source"] for r in rows} == {"aime24"}
    assert not (out / "train.parquet").exists()
    assert default_compute_score("aime24", "\\boxed{204}", rows[0]["reward_model"]["ground_truth"])["score"] == 1.0


def test_aime25_and_math500_from_problem_answer_files(tmp_path):
    aime = tmp_path / "aime_2025"
    aime.mkdir()
    (aime / "train.jsonl").write_text("".join(json.dumps({"id": i, "problem": f"Find {i} times 2.", "answer": str(2 * i),
                                                          "solution": "", "url": "", "year": "2025"}) + "\n"
                                              for i in range(1, 4)))
    assert main(["data", "prep", "aime25", "--source", str(aime), "--out", str(tmp_path / "a25")]) == 0
    rows = _rows(tmp_path / "a25" / "test.parquet")   # the hub calls its one split train; it is a test set
    assert len(rows) == 3 and rows[0]["prompt"][0]["content"] == dapo_prompt("Find 1 times 2.")
    assert rows[2]["reward_model"]["ground_truth"] == "6" and rows[0]["data_source"] == "aime25"

    m500 = tmp_path / "MATH-500"
    m500.mkdir()
    (m500 / "test.jsonl").write_text("".join(json.dumps({"problem": f"Compute {i}/4.", "answer": f"\\frac{{{i}}}{{4}}",
                                                         "solution": f"It is $\\boxed{{\\frac{{{i}}}{{4}}}}$.",
                                                         "subject": "Algebra", "level": 1,
                                                         "unique_id": f"test/algebra/{i}.json"}) + "\n"
                                             for i in range(1, 3)))
    assert main(["data", "prep", "math-500", "--source", str(m500), "--out", str(tmp_path / "m500")]) == 0
    rows = _rows(tmp_path / "m500" / "test.parquet")
    assert rows[0]["data_source"] == "HuggingFaceH4/MATH-500" and rows[0]["reward_model"]["ground_truth"] == "\\frac{1}{4}"
    assert rows[0]["prompt"][0]["content"].endswith("output the final answer within \\boxed{}.")
    assert default_compute_score(rows[0]["data_source"], "so \\boxed{\\dfrac14}", "\\frac{1}{4}")["score"] == 1.0


def test_a_verl_row_without_a_user_message_is_a_counted_bad_row(tmp_path, capsys):
    src = tmp_path / "src"
    (src / "data").mkdir(parents=True)
    rows = verl_rows([("What is 1+1?", "2")], 1) + [{**verl_rows([("x", "1")], 1)[0], "prompt": []}]
    pq.write_table(pa.Table.from_pylist(rows), src / "data" / "d.parquet")
    assert main(["data", "prep", "dapo-math-17k", "--source", str(src), "--out", str(tmp_path / "o")]) == 3
    assert "d.parquet[1]: 'prompt' is not a list of chat messages" in capsys.readouterr().err
    assert main(["data", "prep", "dapo-math-17k", "--source", str(src), "--out", str(tmp_path / "o"),
                 "--on-error", "skip"]) == 0


@pytest.mark.parametrize("name, hub_id", [("dapo-math-17k", "BytedTsinghua-SIA/DAPO-Math-17k"),
                                          ("aime24", "BytedTsinghua-SIA/AIME-2024"), ("aime25", "yentinglin/aime_2025"),
                                          ("math-500", "HuggingFaceH4/MATH-500")])
def test_offline_without_source_is_one_line(name, hub_id, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert main(["data", "prep", name, "--out", str(tmp_path / "o")]) == 3
    err = capsys.readouterr().err.strip()
    assert f"could not download {hub_id}" in err and f"rlctl data prep {name} --source PATH" in err
    assert len(err.splitlines()) == 1
