"""GRPO with rollout.engine = "vllm" learns on CPU through the CLI, as the hf engine does in
test_learning.py (same recipe, dense reward, overrides), on `rlctl model tiny --layers 4 --hidden 256`.

Real everything: `rlctl train` in a child process, Ray actors, vLLM in the actor's process joining its
gloo world, the weights pushed after every update. Every step's `rollout/logprob_diff_mean` (the
engine's log-probs of its samples against the trainer's) stays at float32 noise: an engine that
missed a push would generate with the previous step's weights, miles from 1e-3 (and
rollout.max_logprob_diff would stop the run). Skipped without vllm; a failure under CI=true.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_learning import COMMON, GROUP

from support.dense_reward import DENSE_REWARD

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("vllm_installed")]
STEPS = 8


def test_grpo_with_vllm_learns_and_the_engine_follows_every_update(tmp_path, vllm_tiny_model_dir, arith_data):
    from rlctl.project import write_project

    write_project(tmp_path, "grpo-gsm8k", str(vllm_tiny_model_dir))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "arith").symlink_to(arith_data)
    (tmp_path / "dense.py").write_text(DENSE_REWARD)
    overrides = COMMON + GROUP + [f"run.total_steps={STEPS}", "rollout.engine=vllm", "rollout.enforce_eager=true"]
    proc = subprocess.run([sys.executable, "-m", "rlctl", "train", "rlctl.toml", *overrides], cwd=tmp_path,
                          capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "runs" / "grpo-gsm8k"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    drift = [r["rollout/logprob_diff_mean"] for r in rows]
    assert max(drift) < 1e-4, drift                        # fp32: ~3e-7 measured; a missed push is > 0.1
    rewards = [r["reward/mean"] for r in rows]
    assert sum(rewards[-2:]) / 2 > sum(rewards[:2]) / 2 + 0.2, rewards
    assert json.loads((run / "run.json").read_text())["status"] == "finished"
