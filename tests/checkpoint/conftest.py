"""The session's trained checkpoints (built by ckpt_runs) for the merge tests."""

from __future__ import annotations

import pytest
from ckpt_runs import TrainedRun, train_in_process, train_on_ray


@pytest.fixture(scope="session")
def trained_runs(tmp_path_factory, tiny_model_dir, tiny_untied_model_dir) -> dict[str, TrainedRun]:
    root = tmp_path_factory.mktemp("runs")
    runs = {"full-tied-1w": train_in_process(root / "full-tied-1w", tiny_model_dir, lora=False),
            "lora-untied-1w": train_in_process(root / "lora-untied-1w", tiny_untied_model_dir, lora=True)}
    runs.update(train_on_ray(root, {"full-untied-2w": (tiny_untied_model_dir, False),
                                    "lora-tied-2w": (tiny_model_dir, True)}))
    return runs
