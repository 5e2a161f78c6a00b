"""What `rlctl view` reads: bad input (not a run, a cut-off line, an empty run), SFT, eval and off-policy
files, the filter words, and the tail that follows a growing metrics.jsonl. Hand-written files: fast."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl.cli.main import main
from rlctl.view.data import MetricsTail, load_source
from rlctl.view.samples import parse_filter, prompt_history, sort_samples


def write_lines(path: Path, rows: list[dict], tail: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + tail)
    return path


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


def test_a_folder_that_is_not_a_run_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    assert main(["view", str(tmp_path), "--html", str(tmp_path / "r.html")]) == 2
    assert "is not a run folder" in one_line_error(capsys)
    assert main(["view", str(tmp_path / "missing"), "--html", str(tmp_path / "r.html")]) == 2
    assert "does not exist" in one_line_error(capsys)
    assert not (tmp_path / "r.html").exists()
    bad_eval = write_lines(tmp_path / "other.jsonl", [{"a": 1}])
    assert main(["view", str(bad_eval), "--html", str(tmp_path / "r.html")]) == 2
    assert "not an `rlctl eval --out` file" in one_line_error(capsys)


def test_the_terminal_ui_without_a_terminal_says_so(tmp_path, capsys):
    write_lines(tmp_path / "run" / "metrics.jsonl", [{"step": 1, "reward/mean": 0.5}])
    assert main(["view", str(tmp_path / "run")]) == 2   # pytest's stdin/stdout are not a terminal
    err = one_line_error(capsys)
    assert "needs a terminal" in err and "--html report.html" in err


def test_a_cut_off_last_metrics_line_is_skipped_and_said(tmp_path, capsys):
    run = tmp_path / "run"
    write_lines(run / "metrics.jsonl", [{"step": 1, "reward/mean": 0.25}, {"step": 2, "reward/mean": 0.5}],
                tail='{"step": 3, "reward/me')
    view = load_source(run)
    assert view.series("reward/mean") == ([1, 2], [0.25, 0.5])
    assert any("cut off" in note for note in view.notes)
    assert main(["view", str(run), "--html", str(tmp_path / "r.html")]) == 0
    out = capsys.readouterr()
    assert "note: metrics.jsonl" in out.err and "cut off" in out.err and "wrote" in out.out
    assert '"reward/mean":[[1,2],[0.25,0.5]]' in (tmp_path / "r.html").read_text()


def test_an_empty_run_is_a_view_with_nothing_yet(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps({"name": "fresh", "status": "running", "step": 0, "total_steps": 10}))
    view = load_source(run)
    assert view.name == "fresh" and view.metrics == [] and view.samples == []
    assert view.notes == ["no metrics yet: the run has not finished a step"]
    assert main(["view", str(run), "--html", str(tmp_path / "r.html")]) == 0
    assert "0 samples, 0 metric rows" in capsys.readouterr().out


def test_sft_eval_and_one_step_off_sources(tmp_path):
    sft = tmp_path / "sft"
    write_lines(sft / "metrics.jsonl", [{"step": s, "train/loss": 2.0 / s, "val/loss": 2.5 / s} for s in (1, 2, 4)])
    view = load_source(sft)
    assert view.kind == "sft" and view.series("val/loss")[0] == [1, 2, 4]

    records = [{"index": 0, "sample": j, "data_source": "gsm8k", "prompt": [{"role": "user", "content": "2+2?"}],
                "response": r, "ground_truth": "4", "score": float(r == "4"), "correct": r == "4",
                "finish_reason": "stop", "response_tokens": len(r)} for j, r in enumerate(["4", "five"])]
    evals = load_source(write_lines(tmp_path / "eval.jsonl", records))
    assert evals.kind == "eval" and [s["acc"] for s in evals.samples] == [1.0, 0.0]
    assert evals.samples[1]["messages"][-1] == {"role": "assistant", "content": "five", "gen": True}
    assert evals.samples[1]["length"] == 4 and evals.samples[0]["extra"]["ground_truth"] == "4"

    off = tmp_path / "off"
    write_lines(off / "metrics.jsonl", [{"step": 2, "reward/mean": 0.1, "rollout/staleness": 1.0}])
    write_lines(off / "samples.jsonl", [{"step": 2, "prompt": "<|im_start|>user\nq", "response": "a", "score": 0.5,
                                         "ground_truth": "b", "data_source": "d", "policy_version": 0}])
    view = load_source(off)
    assert "rollout/staleness" in view.metric_keys
    assert view.samples[0]["extra"] == {"ground_truth": "b", "policy_version": 0} and view.samples[0]["step"] == 2


def sample(**kw) -> dict:
    base = {"step": 1, "i": 0, "source": "gsm8k", "score": 0.0, "acc": 0.0, "length": 10, "turns": 1, "calls": 0,
            "errors": 0, "messages": [{"role": "user", "content": "What is 2+2?", "gen": False},
                                      {"role": "assistant", "content": "Four", "gen": True}], "prompt": "What is 2+2?"}
    return {**base, **kw}


def test_filter_words_compare_fields_and_search_the_text():
    a = sample(score=1.0, acc=1.0, length=50)
    b = sample(i=1, source="calc", errors=2, turns=3, length=None,
               messages=[{"role": "tool", "content": "error: division by zero", "gen": False}])
    keep = lambda text: [s["i"] for s in (a, b) if parse_filter(text)(s)]   # noqa: E731
    assert keep("reward>0.5") == [0] and keep("acc=0") == [1] and keep("source:calc") == [1]
    assert keep("source!=calc") == [0] and keep("errors>0 turns>=3") == [1] and keep("len<100") == [0]
    assert keep("DIVISION") == [1] and keep("four reward>=1") == [0] and keep("") == [0, 1]
    with pytest.raises(ValueError, match="reward compares with a number"):
        parse_filter("reward>high")
    assert [s["i"] for s in sort_samples([a, b], "length", reverse=True)] == [0, 1]   # no value: last
    assert [s["i"] for s in sort_samples([a, b], "errors", reverse=True)] == [1, 0]


def test_the_same_prompt_across_steps():
    rows = [sample(step=2, i=0), sample(step=1, i=1), sample(step=1, i=0, prompt="other")]
    assert [(s["step"], s["i"]) for s in prompt_history(rows, "What is 2+2?")] == [(1, 1), (2, 0)]


def test_the_tail_waits_for_a_partial_line_and_rereads_a_rewritten_file(tmp_path):
    path = write_lines(tmp_path / "metrics.jsonl", [{"step": 1, "x": 1.0}], tail='{"step": 2, ')
    tail = MetricsTail(path)
    assert tail.poll() == ([{"step": 1, "x": 1.0}], False) and tail.pending()
    with open(path, "a") as f:
        f.write('"x": 2.0}\n')
    assert tail.poll() == ([{"step": 2, "x": 2.0}], False) and not tail.pending()
    assert tail.poll() == ([], False)
    write_lines(path, [{"step": 1, "x": 5.0}])   # resume truncated it: read again from the start
    assert tail.poll() == ([{"step": 1, "x": 5.0}], True)
