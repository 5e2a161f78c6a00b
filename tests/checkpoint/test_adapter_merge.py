"""`rlctl merge ADAPTER_FOLDER`: refusals before anything loads (fast). Merging a real saved state
is tested end to end in tests/tinker/test_tinker_sdk.py."""

from __future__ import annotations

import json

import pytest

from rlctl.checkpoint.adapter_merge import is_adapter_folder, merge_folder
from rlctl.errors import CheckpointError, UsageError


@pytest.fixture
def adapter(tmp_path):
    folder = tmp_path / "adapter"
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_bytes(b"")
    (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": str(tmp_path / "gone")}))
    return folder


def test_an_adapter_folder_is_told_from_a_run_folder(adapter, tmp_path):
    assert is_adapter_folder(adapter) and not is_adapter_folder(tmp_path)


def test_step_and_best_are_refused_for_an_adapter(adapter, tmp_path):
    with pytest.raises(UsageError, match="--step and --best pick a run's checkpoint"):
        merge_folder(adapter, tmp_path / "out", step=3)
    with pytest.raises(UsageError, match="--step and --best"):
        merge_folder(adapter, tmp_path / "out", best=True)


def test_a_base_model_that_is_not_there_is_named(adapter, tmp_path):
    with pytest.raises(CheckpointError, match="names base model .*gone.*not a local folder"):
        merge_folder(adapter, tmp_path / "out")
    assert not (tmp_path / "out").exists()
