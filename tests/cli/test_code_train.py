"""A short `rlctl train` on the synthetic coding task with the built-in `code` reward (real sandbox): init and
data prep through the console entry, the training through the same CLI entry in this process (on the
shared Ray; the training's own process is tests/cli/test_train_cli.py's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from support.cli import rlctl_here

CPU = ["resources.gpus_per_node=0", "resources.workers=1", "data.batch_size=4", "rollout.n=2",
       "actor.mini_batch_size=4", "actor.micro_batch_size=4", "data.max_prompt_length=256",
       "data.max_response_length=16", "data.val_batch_size=10", "run.total_steps=2", "run.save_every=0",
       'reward.function=""', "reward.format_score=0.1", "reward.workers=2",
       'data.train_files=["data/code-synthetic/train.parquet"]', "data.val_files=[]"]


def rlctl(*args, cwd):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "rlctl", *map(str, args)], cwd=cwd, capture_output=True,
                          text=True, env=env, timeout=600)


@pytest.mark.slow
def test_train_on_code_synthetic_with_the_code_reward(tmp_path, tiny_model_dir, ray_cluster):
    proj = tmp_path / "proj"
    assert rlctl("init", proj, "--recipe", "grpo-arith-cpu", "--model", tiny_model_dir, cwd=tmp_path).returncode == 0
    prep = rlctl("data", "prep", "code-synthetic", cwd=proj)
    assert prep.returncode == 0, prep.stderr
    train = rlctl_here("train", *CPU, cwd=proj)
    assert train.returncode == 0, train.stderr[-3000:]
    rows = [json.loads(line) for line in (proj / "runs/grpo-arith-cpu/metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    # The code reward's own metrics prove the sandbox scored every response.
    assert {"reward/pass_rate", "reward/fail_no_code", "reward/fail_error"} <= set(rows[0])
    shares = sum(rows[0][f"reward/fail_{s}"] for s in ("no_code", "wrong_answer", "error", "timeout", "memory",
                                                        "output_limit"))
    assert shares + rows[0]["reward/acc"] == pytest.approx(1.0)
