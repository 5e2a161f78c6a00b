"""A real multi-turn run for the view tests: `rlctl train` (a subprocess, its own embedded Ray) of GRPO with
the calculator tool, 2 steps x 4 prompts x 2 samples, run.log_rollouts on; made once per session."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from support.parquet_rows import write_rows

REPO = Path(__file__).resolve().parents[2]
QUESTIONS = ("What is 2 + 2?", "What is 2 + 2?", "What is 3 + 4?", "What is 2 + 2?")
OVERRIDES = ["resources.gpus_per_node=0", "resources.workers=1", "data.batch_size=4", "rollout.n=2",
             "actor.mini_batch_size=4", "actor.micro_batch_size=4", "data.max_prompt_length=1024",
             "data.max_response_length=200", "data.val_files=[]", 'data.train_files=["data/train.parquet"]',
             "model.dtype=float32", "model.gradient_checkpointing=false", "reward.function=reward.py:compute_score",
             "reward.workers=1", "actor.lr=1e-4", "rollout.temperature=0.7", "run.log_rollouts=true",
             "rollout.multi_turn.enable=true", 'rollout.multi_turn.tools=["calculator"]',
             "rollout.multi_turn.max_turns=3", "run.total_steps=2", "run.save_every=0", "run.log_samples=2"]


@pytest.fixture(scope="session")
def calc_run(tiny_model_dir, tmp_path_factory) -> Path:
    """The run folder of a real 2-step multi-turn GRPO run whose policy calls the calculator."""
    from multiturn.tool_model import REWARD, train_tool_caller
    from rlctl.project import write_project

    root = tmp_path_factory.mktemp("view_run")
    model = train_tool_caller(tiny_model_dir, root / "tool_model", steps=60)
    project = root / "p"
    write_project(project, "grpo-gsm8k", str(model))
    (project / "reward.py").write_text(REWARD)
    write_rows(project / "data" / "train.parquet", [
        {"data_source": "calc", "prompt": [{"role": "user", "content": q}],
         "reward_model": {"style": "rule", "ground_truth": str(eval(q[8:-1]))}, "extra_info": {"index": i}}
        for i, q in enumerate(QUESTIONS)])
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "rlctl", "train", "rlctl.toml", *OVERRIDES], cwd=project, env=env,
                          capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return project / "runs" / "grpo-gsm8k"
