"""`rlctl eval` of a multi-turn model: the training config's tools, loop and reward on a held-out split."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.cli import rlctl_here
from support.parquet_rows import write_rows
from support.tool_model import REWARD

pytestmark = pytest.mark.slow   # starts Ray, trains a run or starts a subprocess


def test_eval_runs_the_training_tools_and_reward(tmp_path, tool_model_dir):
    from rlctl.checkpoint.merge import TRAINING_CONFIG
    from rlctl.serve.eval import EvalOptions, run_eval

    model = Path(shutil.copytree(tool_model_dir, tmp_path / "merged"))
    (tmp_path / "reward.py").write_text(REWARD)
    (model / TRAINING_CONFIG).write_text(f"""
[model]
path = "{model}"
[data]
train_files = ["{tmp_path / 'data.parquet'}"]
max_response_length = 200
[reward]
function = "{tmp_path / 'reward.py'}:compute_score"
[rollout.multi_turn]
enable = true
tools = ["calculator"]
max_turns = 3
""")
    data = write_rows(tmp_path / "data.parquet", [
        {"data_source": "calc", "prompt": [{"role": "user", "content": "What is 2 + 2?"}],
         "reward_model": {"style": "rule", "ground_truth": gt}, "extra_info": {"index": i}}
        for i, gt in enumerate(["4", "4", "5"])])
    summary = run_eval(model, data, EvalOptions(engine="hf"), tmp_path / "out.jsonl")
    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert summary["all"]["accuracy"] == 2 / 3   # greedy: call, read "4", answer "4"; the third wants 5
    for rec in records:
        assert [m["role"] for m in rec["messages"]] == ["user", "assistant", "tool", "assistant"]
        assert rec["messages"][2]["content"] == "4" and rec["num_turns"] == 2
        assert rec["tool_calls"] == [{"name": "calculator", "arguments": {"expression": "2+2"}, "error": False}]


def test_eval_config_gives_a_model_without_a_run_the_tools_of_an_rl_config(tmp_path, tool_model_dir):
    """`rlctl eval MODEL --config rl.toml`: a plain model folder (an SFT stage, a base model) evaluated
    with that config's tools, multi-turn loop and reward; the summary adds tool_use."""
    (tmp_path / "reward.py").write_text(REWARD)
    (tmp_path / "rl.toml").write_text("""
[model]
path = "unused-by-eval"
[data]
train_files = ["data.parquet"]
max_response_length = 200
[reward]
function = "reward.py:compute_score"
[rollout.multi_turn]
enable = true
tools = ["calculator"]
max_turns = 3
""")
    write_rows(tmp_path / "data.parquet", [
        {"data_source": "calc", "prompt": [{"role": "user", "content": "What is 2 + 2?"}],
         "reward_model": {"style": "rule", "ground_truth": "4"}, "extra_info": {"index": 0}}])
    out = rlctl_here("eval", str(tool_model_dir), "--data", "data.parquet",
                          "--config", "rl.toml", "--engine", "hf", "--out", "out.jsonl", "--format", "json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["config"] == "rl.toml"
    assert summary["all"]["accuracy"] == 1.0 and summary["all"]["tool_use"] == 1.0
    record = json.loads((tmp_path / "out.jsonl").read_text())
    assert [m["role"] for m in record["messages"]] == ["user", "assistant", "tool", "assistant"]
    (tmp_path / "plain.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                       "    return float(solution_str.strip() == ground_truth)\n")
    plain = rlctl_here("eval", str(tool_model_dir), "--data", "data.parquet",
                            "--reward", "plain.py:compute_score", "--engine", "hf", "--out", "plain.jsonl",
                            "--format", "json", cwd=tmp_path)
    assert plain.returncode == 0 and "tool_use" not in json.loads(plain.stdout)["all"]   # no run, no tools
    missing = rlctl_here("eval", str(tool_model_dir), "--data", "data.parquet",
                              "--config", "nope.toml", cwd=tmp_path)
    assert missing.returncode == 2 and "--config nope.toml does not exist" in missing.stderr

