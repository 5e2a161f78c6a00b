"""A start that fails before its first step leaves nothing that blocks a retry: after a data error
(exit 3) the next `rlctl train` of the same run just works, with no --force and no NAME.old-* folder;
a reward.py that does not import, or lacks its function, is refused by validation (exit 2) before
Ray starts, so no run folder is made at all.
"""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from rlctl.project import write_project
from rlctl.tasks.prep import PrepOptions, prepare
from support.cli import rlctl_here

TINY = ["resources.gpus_per_node=0", "resources.workers=1", "data.batch_size=2", "rollout.n=2",
        "actor.mini_batch_size=2", "actor.micro_batch_size=2", "data.max_response_length=8",
        "data.max_prompt_length=96", "data.val_files=[]", "reward.workers=1", "model.dtype=float32",
        "model.gradient_checkpointing=false", "run.total_steps=1", "run.name=retry"]


@pytest.fixture
def project(tmp_path, tiny_model_dir):
    write_project(tmp_path, "grpo-arith-cpu", str(tiny_model_dir))
    prepare("arith", PrepOptions(out=tmp_path / "data" / "arith"))
    table = pq.read_table(tmp_path / "data" / "arith" / "train.parquet")
    pq.write_table(table.rename_columns(["question" if c == "prompt" else c for c in table.column_names]),
                   tmp_path / "bad.parquet")
    return tmp_path


def one_line(result, code: int, *words: str) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == code and len(lines) == 1, result.stderr[-3000:]
    assert all(w in lines[0] for w in words), lines[0]
    return lines[0]


@pytest.mark.parametrize("change", ["def compute_score(:\n", "def other(data_source, solution_str, ground_truth, "
                                                               "extra_info=None):\n    return 0.0\n"])
def test_a_broken_reward_function_is_refused_before_anything_starts(project, change):
    (project / "reward.py").write_text(change)
    result = rlctl_here("config", "validate", *TINY, cwd=project)
    assert result.returncode == 2 and "reward.function" in result.stdout + result.stderr
    one_line(rlctl_here("train", *TINY, cwd=project), 2, "reward.function", "nothing was started")
    assert not (project / "runs").exists()


@pytest.mark.slow
def test_a_retry_after_a_data_error_just_works(project):
    one_line(rlctl_here("train", *TINY, 'data.train_files=["bad.parquet"]', cwd=project), 3, "'prompt'")
    assert (project / "runs" / "retry").is_dir()   # the failed start's folder ...
    one_line(rlctl_here("resume", project / "runs" / "retry"), 2, "failed while starting", "rlctl train")
    ok = rlctl_here("train", *TINY, 'data.train_files=["data/arith/train.parquet"]', cwd=project)
    assert ok.returncode == 0, ok.stderr[-3000:]   # ... is reused: no --force
    assert "starting over in" in ok.stdout + ok.stderr
    assert sorted(p.name for p in (project / "runs").iterdir()) == ["retry"]
    assert (project / "runs" / "retry" / "checkpoints" / "LATEST").is_file()
