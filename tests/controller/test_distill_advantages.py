"""The controller's side of distillation, without Ray: routing rows to teachers and the k1 advantages
(with and without the task reward)."""

from __future__ import annotations

import numpy as np
import pytest

from rlctl.config.schema import Config, DistillConfig
from rlctl.controller.distill import Teachers, distill_advantages
from rlctl.errors import DataError
from rlctl.runtime.batch import Batch, object_array


def _batch() -> Batch:
    return Batch({"advantages": np.array([[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]], np.float32),
                  "old_log_prob": np.array([[-1.0, -2.0, 0.0], [-0.5, -0.5, -0.5]], np.float32),
                  "teacher_log_prob": np.array([[-0.5, -3.0, 0.0], [-0.5, -1.5, -0.5]], np.float32),
                  "response_mask": np.array([[1, 1, 0], [1, 1, 1]]),
                  "data_source": object_array(["a", "b"]), "extra_info": object_array([{"t": "x"}, {"t": "y"}])})


@pytest.mark.parametrize("use_task_reward", [False, True])
def test_k1_advantages_add_the_task_advantages_only_when_asked(use_task_reward):
    batch = _batch()
    config = Config(distill=DistillConfig(teacher="t", coef=2.0, use_task_reward=use_task_reward))
    distill_advantages(batch, config)
    distill = np.array([[1.0, -2.0, 0.0], [0.0, -2.0, 0.0]])   # 2 x -(l_s - l_t), 0 on padding
    task = np.array([[1.0, 1.0, 0.0], [-1.0, -1.0, -1.0]]) if use_task_reward else 0.0
    assert np.allclose(batch["advantages"], distill + task)


def test_supervised_forms_leave_only_the_task_advantages():
    batch = _batch()
    distill_advantages(batch, Config(distill=DistillConfig(teacher="t", loss="k3")))
    assert (batch["advantages"] == 0).all()


def test_routing_by_column_or_extra_info_and_unknown_values_stop():
    teachers = Teachers(Config(distill=DistillConfig(teachers={"a": "p", "b": "q"})), {"a": None, "b": None})
    assert teachers.route(_batch()).tolist() == ["a", "b"]
    by_info = Teachers(Config(distill=DistillConfig(teachers={"x": "p", "y": "q"}, teacher_key="t")),
                       {"x": None, "y": None})
    assert by_info.route(_batch()).tolist() == ["x", "y"]
    missing = Teachers(Config(distill=DistillConfig(teachers={"a": "p"})), {"a": None})
    with pytest.raises(DataError, match="'b'"):
        missing.route(_batch())
