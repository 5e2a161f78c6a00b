"""model.path = a run folder: rlctl.checkpoint.run_folder.run_model reuses <run>/hf/step_<N> without reading
the checkpoint again, and a run folder without a usable checkpoint is still an error."""

from __future__ import annotations

import pytest

from rlctl.checkpoint.run_folder import run_model
from rlctl.errors import CheckpointError


def run_folder(tmp_path, latest: str | None = None):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    if latest is not None:
        (run / "checkpoints" / "LATEST").write_text(latest + "\n")
    return run


def test_merged_export_is_reused_without_verifying_the_checkpoint_again(tmp_path, monkeypatch):
    run = run_folder(tmp_path, "step_3")
    (run / "hf" / "step_3").mkdir(parents=True)
    (run / "hf" / "step_3" / "config.json").write_text("{}")
    monkeypatch.setattr("rlctl.checkpoint.merge.merge_run", lambda *a, **k: pytest.fail("merged again"))
    monkeypatch.setattr("rlctl.checkpoint.manager.verify", lambda *a, **k: pytest.fail("checkpoint hashed"))
    assert run_model(run) == (run / "hf" / "step_3").resolve()


def test_run_folder_without_a_usable_checkpoint_is_an_error(tmp_path):
    with pytest.raises(CheckpointError, match="no checkpoints in"):
        run_model(run_folder(tmp_path))
    (tmp_path / "run" / "checkpoints" / "step_1").mkdir()   # no manifest: not a checkpoint
    with pytest.raises(CheckpointError, match="no valid checkpoint in"):
        run_model(tmp_path / "run")
    (tmp_path / "run" / "checkpoints" / "LATEST").write_text("step_1\n")
    with pytest.raises(CheckpointError, match="no valid checkpoint in"):
        run_model(tmp_path / "run")
    with pytest.raises(CheckpointError, match="does not exist"):
        run_model(tmp_path / "nowhere")
