"""examples/tinker/cookbook_local.py's --start-from: the resume record it writes for a recipe, and its
refusals, before any recipe or server runs (in-process, fast). The record is read by the cookbook's own
resume in test_tinker_sdk.py's sl_loop test."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STATE = "tinker://run-1/weights/final"


@pytest.fixture(scope="module")
def wrapper():
    spec = importlib.util.spec_from_file_location("cookbook_local", REPO / "examples" / "tinker" / "cookbook_local.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_main(wrapper, monkeypatch, *args) -> None:
    monkeypatch.setattr(sys, "argv", ["cookbook_local.py", "--data-dir", "data", "--tokenizer", "model", *args])
    wrapper.main()


def refusal(wrapper, monkeypatch, capsys, *args) -> str:
    with pytest.raises(SystemExit) as exit_:
        run_main(wrapper, monkeypatch, *args)
    err = capsys.readouterr().err.strip()
    assert exit_.value.code == 2 and len(err.splitlines()) == 1, err
    return err


def test_the_record_names_the_state_at_batch_0(wrapper, tmp_path):
    wrapper.start_from(tmp_path / "rl", STATE)
    lines = (tmp_path / "rl" / "checkpoints.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{"name": "start-from", "batch": 0, "state_path": STATE}]


def test_a_log_folder_gives_its_last_state(wrapper, tmp_path):
    """sl_loop's checkpoints.jsonl: state records, and sampler-only ones that cannot be resumed."""
    records = [{"name": "000002", "batch": 2, "state_path": "tinker://r/weights/000002"},
               {"name": "final", "batch": 4, "state_path": STATE, "sampler_path": "tinker://r/sampler_weights/final"},
               {"name": "eval", "batch": 4, "sampler_path": "tinker://r/sampler_weights/eval"}]
    (tmp_path / "checkpoints.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    assert wrapper.start_state(str(tmp_path)) == STATE
    assert wrapper.start_state(STATE) == STATE


def test_bad_starts_are_refused_in_one_line(wrapper, monkeypatch, capsys, tmp_path):
    recipe = ["tinker_cookbook.recipes.rl_loop", "model_name=org/model", f"log_path={tmp_path / 'rl'}"]
    err = refusal(wrapper, monkeypatch, capsys, "--start-from", "tinker://run-1/sampler_weights/final", *recipe)
    assert "not a training state" in err
    err = refusal(wrapper, monkeypatch, capsys, "--start-from", str(tmp_path / "nowhere"), *recipe)
    assert "nor a recipe log folder" in err
    err = refusal(wrapper, monkeypatch, capsys, "--start-from", STATE, *recipe[:2])
    assert "needs the recipe's log_path" in err
    wrapper.start_from(tmp_path / "rl", STATE)   # a run that already has its own checkpoints
    err = refusal(wrapper, monkeypatch, capsys, "--start-from", STATE, *recipe)
    assert "already lists checkpoints" in err and "new log_path" in err
    assert not (tmp_path / "nowhere").exists()
