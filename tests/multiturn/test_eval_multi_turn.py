"""`rlctl eval` of a multi-turn model: the training config's tools, loop and reward on a held-out split."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from support.parquet_rows import write_rows
from tool_model import REWARD


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
