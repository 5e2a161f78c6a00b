"""A verl user's DAPO-Math-17k + AIME run script converts, validates, and the dapo-math-17k-cpu recipe
trains on a slice of DAPO-Math-17k rows (in the hub file's layout, written here) through the CLI:
init -> data prep -> train 2 steps, with verl's math_dapo reward (+1 / -1) scoring every sample."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.cli import rlctl_here
from support.dapo_rows import write_hub_copy

from rlctl.config.loader import load_config
from rlctl.validate import validate

FIXTURES = Path(__file__).parents[1] / "fixtures" / "verl"


def test_the_converted_dapo_script_validates(tmp_path, tiny_model_dir, monkeypatch):
    proj = tmp_path / "proj"
    proj.mkdir()
    dapo = write_hub_copy(tmp_path / "dapo", "dapo-math-17k.parquet", 2)
    assert rlctl_here("data", "prep", "dapo-math-17k", "--source", dapo, cwd=proj).returncode == 0
    assert rlctl_here("data", "prep", "aime24", "--source", write_hub_copy(tmp_path / "aime", "aime-2024.parquet", 4),
                      cwd=proj).returncode == 0
    monkeypatch.setenv("TRAIN_FILE", "data/dapo-math-17k/train.parquet")
    monkeypatch.setenv("TEST_FILE", "data/aime24/test.parquet")
    made = rlctl_here("config", "from-verl", FIXTURES / "run_dapo_math.sh", "--model", tiny_model_dir, cwd=proj)
    assert made.returncode == 0, made.stderr
    problems, _ = validate(load_config(proj / "rlctl.toml"), machine=False)
    assert [f"{p.key}: {p.message}" for p in problems if p.severity == "error"] == []


@pytest.mark.slow
def test_dapo_math_cpu_recipe_trains(tmp_path, tiny_model_dir, ray_cluster):
    proj = tmp_path / "proj"
    assert rlctl_here("init", proj, "--recipe", "dapo-math-17k-cpu", "--model", tiny_model_dir).returncode == 0
    prep = rlctl_here("data", "prep", "dapo-math-17k", "--source", write_hub_copy(tmp_path / "dapo", "d.parquet", 3),
                      "--limit", "4", cwd=proj)
    assert prep.returncode == 0, prep.stderr
    train = rlctl_here("train", "run.total_steps=2", "run.save_every=0", "data.max_response_length=24",
                       "reward.overlong.buffer_len=8", "rollout.n=2", cwd=proj)
    assert train.returncode == 0, train.stderr[-3000:]
    rows = [json.loads(line) for line in (proj / "runs/dapo-math-17k-cpu/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert -1.0 - 1e-6 <= rows[0]["reward/mean"] <= 1.0 and "dynamic_sampling/rounds" in rows[0]
