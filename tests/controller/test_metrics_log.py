"""Metric sinks writing real files in a tmp run folder."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import pytest

from rlctl.controller.metrics_log import MetricsLogger, read_jsonl, truncate_logs
from rlctl.errors import UsageError

CONFIG = {"run": {"name": "demo", "seed": 1}, "actor": {"lr": 1e-6}}


def step_metrics(step: int) -> dict:
    """Realistic values of mixed types, as the loop produces them."""
    return {"reward/mean": np.float32(0.25 * step), "response_length/mean": 10.0 + step,
            "actor/pg_loss": -0.01 * step, "actor/kl": np.float64(1e-3 * step), "actor/entropy": 2.0 - 0.1 * step,
            "timing/step_s": 1.5, "perf/tokens_per_s": 300, "actor/skipped": False}


def samples(step: int) -> list[dict]:
    return [{"prompt": f"What is {step}+{i}? ✓", "response": str(step + i), "reward": np.float32(i),
             "index": np.int64(i)} for i in range(2)]


def run_steps(run_dir, steps, **kw) -> None:
    with MetricsLogger(run_dir, ["console", "jsonl"], "demo", CONFIG, **kw) as logger:
        for step in steps:
            logger.log(step, step_metrics(step))
            logger.log_samples(step, samples(step))


def test_one_flushed_row_per_step(tmp_path):
    logger = MetricsLogger(tmp_path, ["jsonl"], "demo", CONFIG)
    written = logger.log(1, {**step_metrics(1), "actor/grad_norm": float("nan"), "x": np.inf})
    # Readable while the run is still going (flushed each step), exactly as returned.
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert rows == [written]
    row = rows[0]
    assert list(row)[0] == "step" and row["step"] == 1
    assert row["reward/mean"] == 0.25 and row["actor/kl"] == pytest.approx(1e-3)
    assert row["perf/tokens_per_s"] == 300 and isinstance(row["perf/tokens_per_s"], int)
    assert row["actor/skipped"] == 0
    assert row["actor/grad_norm"] is None and row["x"] is None  # non-finite: JSON null, not NaN
    assert "NaN" not in (tmp_path / "metrics.jsonl").read_text()
    logger.close()


def test_samples_are_one_line_each_with_plain_json(tmp_path):
    run_steps(tmp_path, [1, 2])
    rows = read_jsonl(tmp_path / "samples.jsonl")
    assert [(r["step"], r["index"]) for r in rows] == [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert rows[1] == {"step": 1, "prompt": "What is 1+1? ✓", "response": "2", "reward": 1.0, "index": 1}


def test_a_non_numeric_metric_is_a_bug(tmp_path):
    with MetricsLogger(tmp_path, ["jsonl"], "demo", CONFIG) as logger:
        with pytest.raises(TypeError, match="'phase' is str"):
            logger.log(1, {"phase": "rollout"})


def test_resume_truncates_then_appends_like_an_uninterrupted_run(tmp_path):
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run_steps(straight, range(1, 7))
    run_steps(resumed, range(1, 6))  # interrupted after step 5; the checkpoint is at step 3
    with open(resumed / "metrics.jsonl", "a") as f:
        f.write('{"step": 6, "reward/me')  # killed mid-write
    dropped = truncate_logs(resumed, 3)
    assert dropped == 3 + 4  # metrics rows 4, 5 and the torn line; sample rows of steps 4 and 5
    assert [r["step"] for r in read_jsonl(resumed / "metrics.jsonl")] == [1, 2, 3]
    run_steps(resumed, range(4, 7), start_step=3)
    for name in ("metrics.jsonl", "samples.jsonl"):
        assert (resumed / name).read_text() == (straight / name).read_text()
    assert truncate_logs(resumed, 6) == 0


def test_console_only_writes_no_files(tmp_path):
    run_steps(tmp_path / "run", [1])
    run_dir = tmp_path / "quiet"
    with MetricsLogger(run_dir, ["console"], "demo", CONFIG) as logger:
        logger.log(1, step_metrics(1))
        logger.log_samples(1, samples(1))
    assert list(run_dir.iterdir()) == []


def test_unknown_logger_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="unknown logger 'mlflow'") as info:
        MetricsLogger(tmp_path, ["jsonl", "mlflow"], "demo", CONFIG)
    assert info.value.exit_code == 2
    assert not (tmp_path / "metrics.jsonl").exists()


@pytest.mark.parametrize("sink", ["tensorboard", "wandb"])
def test_missing_optional_package_says_how_to_install(tmp_path, sink):
    if importlib.util.find_spec(sink) is not None:
        pytest.skip(f"{sink} is installed")
    with pytest.raises(UsageError) as info:
        MetricsLogger(tmp_path, ["jsonl", sink], "demo", CONFIG)
    assert info.value.exit_code == 2
    assert f'pip install "rlctl[{sink}]"' in info.value.hint and sink in info.value.message
    assert list(tmp_path.iterdir()) == []  # failed before creating anything


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None, reason='needs pip install "rlctl[tensorboard]"')
def test_tensorboard_events_hold_the_scalars(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsLogger(tmp_path, ["tensorboard"], "demo", CONFIG) as logger:
        for step in (1, 2, 3):
            logger.log(step, step_metrics(step))
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    reward = [(e.step, e.value) for e in events.Scalars("reward/mean")]
    assert reward == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert "config" in json.dumps(events.Tags())
