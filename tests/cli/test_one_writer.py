"""One writer per run folder, through the real CLI: while a `rlctl train` runs (a real process, a
tiny model), a second `rlctl resume`, `rlctl train` and `rlctl merge --to-hf` of its folder are each
refused in one line with exit 2, and the live run's metrics.jsonl is never replaced or trimmed: the
run finishes with every step's row, in order, in the same file, and its figures equal those of the same
run made undisturbed (every metric but wall-clock ones).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rlctl.project import write_project
from rlctl.tasks.prep import PrepOptions, prepare
from support.cli import rlctl_here

STEPS = 30
ARGS = ["resources.gpus_per_node=0", "resources.workers=1", "data.batch_size=2", "rollout.n=2",
        "actor.mini_batch_size=2", "actor.micro_batch_size=2", "data.max_response_length=8",
        "data.max_prompt_length=96", "data.val_files=[]", 'data.train_files=["data/arith/train.parquet"]',
        "reward.function=arith", "reward.workers=1", "model.dtype=float32", "model.gradient_checkpointing=false",
        f"run.total_steps={STEPS}", "run.save_every=2", "run.keep_last=1", "run.name=dup"]


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def _figures(path: Path) -> list[dict]:
    """Each step's metrics without the wall-clock ones (timing/, perf/), which no two runs share."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [{k: v for k, v in row.items() if not k.startswith(("timing/", "perf/"))} for row in rows]


@pytest.mark.slow
def test_a_second_writer_of_a_live_run_is_refused_and_the_run_loses_nothing(tmp_path, tiny_model_dir, ray_cluster):
    write_project(tmp_path, "grpo-gsm8k", str(tiny_model_dir))
    prepare("arith", PrepOptions(out=tmp_path / "data" / "arith"))
    run = tmp_path / "runs" / "dup"
    live = subprocess.Popen([sys.executable, "-m", "rlctl", "train", *ARGS], cwd=tmp_path,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while not (run / "checkpoints" / "LATEST").is_file():   # a checkpoint a resume could pick
            assert live.poll() is None, live.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the live run saved no checkpoint"
            time.sleep(0.2)
        metrics = run / "metrics.jsonl"
        inode, before = metrics.stat().st_ino, metrics.read_bytes()
        for args in (["resume", run], ["train", *ARGS], ["merge", run, "--to-hf", tmp_path / "merged"]):
            refused = rlctl_here(*args, cwd=tmp_path)
            lines = refused.stderr.strip().splitlines()
            assert refused.returncode == 2, (args[0], refused.stderr[-2000:])
            assert len(lines) == 1 and "is in use by a running `rlctl train`" in lines[0], (args[0], lines)
        assert live.poll() is None, "the live run ended before every second writer was tried"
        assert not (tmp_path / "merged").exists()
        _, err = live.communicate(timeout=900)
    finally:
        live.kill()
    assert live.returncode == 0, err[-3000:]
    assert metrics.stat().st_ino == inode
    assert metrics.read_bytes().startswith(before)
    assert _steps(metrics) == list(range(1, STEPS + 1))
    assert json.loads((run / "run.json").read_text())["step"] == STEPS
    alone = rlctl_here("train", *ARGS, "run.name=alone", cwd=tmp_path)   # the same run, undisturbed (shared Ray)
    assert alone.returncode == 0, alone.stderr[-3000:]
    assert _figures(metrics) == _figures(tmp_path / "runs" / "alone" / "metrics.jsonl")
