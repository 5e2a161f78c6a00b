"""The validation metrics the trainer logs are the names run.best_metric is checked against."""

from __future__ import annotations

import numpy as np
import pytest

from rlctl.config.metrics import validation_metric_names
from rlctl.controller.trainer import validation_line, validation_metrics
from rlctl.runtime.batch import Batch, object_array


def _part(sources, scores, acc, lengths) -> Batch:
    return Batch({"data_source": object_array(sources), "scores": np.array(scores, dtype=np.float32),
                  "acc": np.array(acc, dtype=np.float32), "response_length": np.array(lengths, dtype=np.int64)})


def test_logged_names_are_the_validated_names_and_the_values_are_means():
    parts = [_part(["a", "b"], [1.0, 0.0], [1.0, 0.0], [4, 6]), _part(["a"], [0.5], [0.0], [8])]
    metrics = validation_metrics(parts)
    assert list(metrics) == validation_metric_names({"a", "b"})
    assert metrics["val/reward/mean"] == pytest.approx(0.5) and metrics["val/response_length/mean"] == 6.0
    assert metrics["val/a/reward/mean"] == pytest.approx(0.75) and metrics["val/a/acc"] == 0.5
    assert metrics["val/b/acc"] == 0.0
    assert "a acc 0.500, b acc 0.000" in validation_line(3, metrics)


def test_with_several_samples_per_prompt_validation_logs_pass_at_k():
    """rollout.val_n = 4: two prompts of source a (1 of 4 right, 4 of 4), one of b (none right)."""
    part = _part(["a"] * 8 + ["b"] * 4, [0.0] * 12, [1, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0], [3] * 12)
    part["uid"] = object_array(["p0"] * 4 + ["p1"] * 4 + ["p2"] * 4)
    metrics = validation_metrics([part])
    assert list(metrics) == validation_metric_names({"a", "b"}, val_n=4)
    assert metrics["val/a/acc"] == pytest.approx(5 / 8)                        # mean@4 (DAPO's avg@4)
    assert metrics["val/a/acc/pass@1"] == pytest.approx((0.25 + 1.0) / 2)
    assert metrics["val/a/acc/pass@2"] == pytest.approx((0.5 + 1.0) / 2)       # 1 - C(3,2)/C(4,2) = 0.5
    assert metrics["val/a/acc/pass@4"] == 1.0 and metrics["val/b/acc/pass@4"] == 0.0
    assert metrics["val/acc/pass@4"] == pytest.approx(2 / 3)
