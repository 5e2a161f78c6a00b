"""PRIME's accuracy filtering in the controller: [algorithm.dynamic_sampling]'s band and truncation
filter pick whole groups of a scored batch, every column alike, in the synchronous loop (a real
one-step run) as in the asynchronous one (the same helper); validate refuses bands and settings
that cannot work."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from rlctl.config.checks import CheckContext
from rlctl.config.loader import load_config
from rlctl.config.schema import Config, DynamicSamplingConfig
from rlctl.controller.rollout import sampling_filter
from rlctl.errors import ConfigError
from rlctl.runtime.batch import Batch, object_array
from rlctl.validate.training import check_dynamic_sampling
from support.dense_reward import ONE_DENSE_STEP


def scored_batch() -> Batch:
    """4 prompts x 4 samples, prompt-major: acc means 0, 0.25, 0.5, 1.0; one response of c truncated."""
    acc = np.array([0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 1, 0, 1, 1, 1, 1], dtype=np.float32)
    truncated = np.zeros(16, dtype=bool)
    truncated[9] = True
    return Batch({"uid": object_array(np.repeat(["a", "b", "c", "d"], 4).tolist()), "acc": acc,
                  "scores": acc * 2 - 1, "truncated": truncated, "row": np.arange(16),
                  "responses": np.arange(16 * 3).reshape(16, 3)})


def kept_rows(**ds) -> list[int]:
    batch = scored_batch()
    kept = batch.select(np.flatnonzero(sampling_filter(batch, DynamicSamplingConfig(enable=True, **ds)).keep))
    np.testing.assert_array_equal(kept["responses"], scored_batch()["responses"][kept["row"]])   # columns aligned
    assert kept["uid"].tolist() == np.repeat(["a", "b", "c", "d"], 4)[kept["row"]].tolist()
    return kept["row"].tolist()


def test_the_config_picks_the_filter():
    b, c = list(range(4, 8)), list(range(8, 12))
    assert kept_rows(metric="acc") == b + c                                   # spread > 0
    assert kept_rows(metric="acc", filter_accuracy=True) == b + c             # [0.2, 0.8]
    assert kept_rows(metric="acc", filter_accuracy=True, accuracy_lower_bound=0.5) == c
    assert kept_rows(metric="acc", filter_accuracy=True, accuracy_upper_bound=1.0) == b + c + list(range(12, 16))
    assert kept_rows(metric="acc", filter_accuracy=True, filter_truncate=True) == b
    assert kept_rows(metric="score", filter_truncate=True) == b                # truncation with the spread test


def problems(**ds):
    base = Config()
    config = dataclasses.replace(base, algorithm=dataclasses.replace(
        base.algorithm, dynamic_sampling=DynamicSamplingConfig(**ds)), rollout=dataclasses.replace(base.rollout, n=4))
    return [(p.key, p.severity, p.message) for p in check_dynamic_sampling(config, CheckContext(base_dir=None, raw={}))]


def test_validate_refuses_a_bad_band_and_a_band_of_scores():
    assert problems(enable=True, metric="acc", filter_accuracy=True, filter_truncate=True) == []
    [(key, severity, message)] = problems(enable=True, metric="acc", filter_accuracy=True,
                                          accuracy_lower_bound=0.9, accuracy_upper_bound=0.1)
    assert key == "algorithm.dynamic_sampling.accuracy_lower_bound" and severity == "error"
    assert message.startswith("0.9 is above accuracy_upper_bound = 0.1, so no group would be kept")
    [(key, severity, message)] = problems(enable=True, metric="score", filter_accuracy=True)
    assert key == "algorithm.dynamic_sampling.metric" and severity == "error" and 'set metric = "acc"' in message
    assert [(k, s) for k, s, _ in problems(filter_accuracy=True, filter_truncate=True)] == [
        ("algorithm.dynamic_sampling.filter_accuracy", "warning"),
        ("algorithm.dynamic_sampling.filter_truncate", "warning")]


def test_loader_bounds_and_verl_names(tmp_path):
    (tmp_path / "rlctl.toml").write_text('[model]\npath = "m"\n[data]\ntrain_files = ["t.parquet"]\n')
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / "rlctl.toml", ["algorithm.dynamic_sampling.accuracy_upper_bound=1.5",
                                              "data.filter_accuracy=true", "data.oversample_factor=4"])
    text = str(err.value.problems)
    assert "algorithm.dynamic_sampling.accuracy_upper_bound: must be <= 1" in text, text
    assert "did you mean 'algorithm.dynamic_sampling.filter_accuracy'" in text, text
    assert "did you mean 'algorithm.dynamic_sampling.max_gen_batches'" in text, text


# Binary accuracy by the parity of the response's length: about half of each group is right, so
# the band [0.5, 0.5] (exactly 2 of 4 right) keeps some groups and drops others every round.
PARITY_REWARD = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    acc = float(len(solution_str) % 2 == 0)
    return {"score": acc, "acc": acc}
'''


@pytest.mark.slow
def test_a_step_trains_only_on_groups_inside_the_band(tmp_path, make_project, ray_cluster):
    from rlctl.controller.run import start_training

    proj = make_project(tmp_path, "grpo-gsm8k")
    (proj / "dense.py").write_text(PARITY_REWARD)
    band = ["algorithm.dynamic_sampling.enable=true", "algorithm.dynamic_sampling.metric=acc",
            "algorithm.dynamic_sampling.filter_accuracy=true", "algorithm.dynamic_sampling.accuracy_lower_bound=0.5",
            "algorithm.dynamic_sampling.accuracy_upper_bound=0.5", "algorithm.dynamic_sampling.max_gen_batches=4",
            "run.log_rollouts=true"]
    start_training(load_config(proj / "rlctl.toml", list(ONE_DENSE_STEP) + band), address=None, force=False)
    run = proj / "runs" / "grpo-gsm8k"
    [row] = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    samples = [json.loads(line) for line in (run / "rollouts" / "step_1.jsonl").read_text().splitlines()]
    assert 1 <= row["dynamic_sampling/rounds"] <= 4 and row["dynamic_sampling/groups"] >= 1, row
    assert len(samples) == 4 * min(int(row["dynamic_sampling/groups"]), 4)
    for g in range(0, len(samples), 4):   # the trained rows, prompt-major: each group 2 of 4 right
        group = samples[g:g + 4]
        assert len({json.dumps(s["prompt_ids"]) for s in group}) == 1
        assert sum(s["score"] for s in group) == 2.0, [s["score"] for s in group]
