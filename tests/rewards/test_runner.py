"""The reward runner with real worker processes and real reward files written to tmp folders."""

from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from rlctl.errors import ConfigError, RewardError
from rlctl.rewards.runner import RewardRunner

pytestmark = pytest.mark.timeout(120)

# One user file with a behaviour per solution_str, so most tests share one pool.
REWARD_PY = '''
import math, os, time

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    if solution_str == "raise":
        raise ZeroDivisionError("division by zero in the scorer")
    if solution_str == "hang":
        open(os.environ["PID_FILE"], "w").write(str(os.getpid()))
        time.sleep(600)
    if solution_str == "die":
        os._exit(3)
    junk = {"nan": float("nan"), "none": None, "str": "1.0", "inf": math.inf, "noscore": {"acc": 1.0}}
    if solution_str in junk:
        return junk[solution_str]
    correct = float(solution_str.strip() == str(ground_truth))
    return {"score": correct, "acc": correct, "length": len(solution_str), "pred": solution_str.strip()}
'''


def items_for(solutions, ground_truth="42", data_source="toy"):
    return [{"data_source": data_source, "solution_str": s, "ground_truth": ground_truth,
             "extra_info": {"index": i}} for i, s in enumerate(solutions)]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("project")
    (root / "reward.py").write_text(REWARD_PY)
    return root


@pytest.fixture(scope="module")
def runner(project):
    with RewardRunner("reward.py:compute_score", project, timeout_s=5, on_error="zero", workers=2) as rr:
        yield rr


@pytest.mark.slow
def test_dict_scores_and_numeric_extras(runner):
    solutions = ["42", "41", " 42 ", "x" * 7, "42"]
    result = runner.score(items_for(solutions))
    expected = np.array([s.strip() == "42" for s in solutions], dtype=np.float32)
    assert result.scores.dtype == np.float32
    np.testing.assert_array_equal(result.scores, expected)
    np.testing.assert_array_equal(result.extras["length"], [len(s) for s in solutions])
    assert "pred" not in result.extras  # a string: not a metric
    assert result.metrics["reward/extras_dropped"] == 1
    assert result.metrics["reward/acc"] == pytest.approx(expected.mean())
    assert result.metrics["reward/errors"] == 0 and not result.failed.any()


@pytest.mark.slow
def test_junk_returns_score_zero_and_are_counted(runner):
    solutions = ["42", "nan", "none", "str", "inf", "noscore", "raise", "42", "42", "42", "42", "42", "42", "42"]
    result = runner.score(items_for(solutions))
    bad = [1, 2, 3, 4, 5, 6]
    assert sorted(result.errors) == bad
    assert result.failed.tolist() == [i in bad for i in range(len(solutions))]
    assert result.scores[bad].tolist() == [0.0] * len(bad)
    assert result.scores[[0, 7, 13]].tolist() == [1.0, 1.0, 1.0]
    assert "nan" in result.errors[1] and "None" in result.errors[2] and "'1.0'" in result.errors[3]
    assert "inf" in result.errors[4] and "without 'score'" in result.errors[5]
    assert result.errors[6] == "ZeroDivisionError: division by zero in the scorer"
    assert result.metrics["reward/errors"] == 6 and result.metrics["reward/timeouts"] == 0
    assert np.isnan(result.extras["length"][bad]).all()


@pytest.mark.slow
def test_more_than_half_failing_stops_the_run(runner):
    exactly_half = runner.score(items_for(["raise", "42", "raise", "42"]))
    assert exactly_half.metrics["reward/errors"] == 2
    with pytest.raises(RewardError) as info:
        runner.score(items_for(["raise", "42", "raise", "raise"]))
    assert info.value.exit_code == 5
    assert "more than half of a batch of 4 samples" in info.value.message and "sample 0" in info.value.message
    # The pool is still usable afterwards.
    assert runner.score(items_for(["42"])).scores.tolist() == [1.0]


@pytest.mark.slow
def test_fail_mode_names_the_sample(project):
    with RewardRunner("reward.py:compute_score", project, timeout_s=5, on_error="fail", workers=1) as rr:
        with pytest.raises(RewardError) as info:
            rr.score(items_for(["42", "41", "42", "raise", "42"], data_source="openai/gsm8k"))
        assert info.value.exit_code == 5
        message = info.value.message
        assert "sample 3" in message and "'openai/gsm8k'" in message and "ZeroDivisionError" in message
        with pytest.raises(RewardError, match="sample 1 .*nan"):
            rr.score(items_for(["42", "nan"]))
        assert rr.score(items_for(["42", "0"])).scores.tolist() == [1.0, 0.0]


@pytest.mark.slow
def test_a_hung_sample_is_killed_and_the_rest_scored(project, tmp_path, monkeypatch):
    pid_file = tmp_path / "hung.pid"
    monkeypatch.setenv("PID_FILE", str(pid_file))  # spawned workers inherit the environment
    with RewardRunner("reward.py:compute_score", project, timeout_s=0.5, on_error="zero", workers=1) as rr:
        rr.score(items_for(["42"]))  # warm: the worker has started
        start = time.monotonic()
        result = rr.score(items_for(["42", "hang", "42", "41", "42"]))
        elapsed = time.monotonic() - start
        assert sorted(result.errors) == [1] and "timed out after 0.5 s" in result.errors[1]
        assert result.scores.tolist() == [1.0, 0.0, 1.0, 0.0, 1.0]  # samples after the hang: new worker
        assert result.metrics["reward/timeouts"] == 1 and result.metrics["reward/errors"] == 1
        assert 0.5 <= elapsed < 10
        hung_pid = int(pid_file.read_text())
        with pytest.raises(ProcessLookupError):
            os.kill(hung_pid, 0)
        assert rr.score(items_for(["42", "42"])).scores.tolist() == [1.0, 1.0]


@pytest.mark.slow
def test_fail_mode_timeout_and_dead_worker(project, tmp_path, monkeypatch):
    monkeypatch.setenv("PID_FILE", str(tmp_path / "hung.pid"))
    with RewardRunner("reward.py:compute_score", project, timeout_s=0.5, on_error="fail", workers=2) as rr:
        with pytest.raises(RewardError, match=r"sample 2 .*timed out after 0.5 s"):
            rr.score(items_for(["42", "42", "hang", "42"]))
    with RewardRunner("reward.py:compute_score", project, timeout_s=5, on_error="zero", workers=1) as rr:
        result = rr.score(items_for(["42", "die", "42"]))
        assert result.errors == {1: "the reward worker process died (exit code 3)"}
        assert result.scores.tolist() == [1.0, 0.0, 1.0]


@pytest.mark.slow
def test_a_batch_of_256_trivial_samples_is_fast(tmp_path):
    (tmp_path / "fast.py").write_text("def score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                      "    return float(solution_str == ground_truth)\n")
    items = items_for([str(i % 4) for i in range(256)], ground_truth="1")
    with RewardRunner("fast.py:score", tmp_path, timeout_s=5, on_error="fail", workers=2) as rr:
        rr.score(items)  # the first call waits for the workers to start
        start = time.perf_counter()
        result = rr.score(items)
        elapsed = time.perf_counter() - start
    assert result.scores.sum() == 64
    assert elapsed < 0.5, f"256 trivial samples took {elapsed:.3f} s"


@pytest.mark.slow
def test_positional_signature_and_sibling_imports(tmp_path):
    sub = tmp_path / "rewards"
    sub.mkdir()
    (sub / "helpers.py").write_text("def norm(s):\n    return s.strip().lower()\n")
    (sub / "mine.py").write_text(textwrap.dedent("""
        from helpers import norm

        def judge(a, b, c, d):
            return 0.5 if norm(b) == norm(c) else -0.5
    """))
    with RewardRunner("rewards/mine.py:judge", tmp_path, timeout_s=5, on_error="fail", workers=1) as rr:
        result = rr.score(items_for([" YES", "no"], ground_truth="yes"))
    assert result.scores.tolist() == [0.5, -0.5]


@pytest.mark.slow
def test_builtins_by_data_source_and_by_name(tmp_path):
    items = [{"data_source": "openai/gsm8k", "solution_str": "so 6 * 7 = 42\n#### 42", "ground_truth": "42"},
             {"data_source": "openai/gsm8k", "solution_str": "#### 41", "ground_truth": "42"},
             {"data_source": "openai/gsm8k", "solution_str": "42", "ground_truth": "42"}]
    with RewardRunner("", tmp_path, timeout_s=5, on_error="fail", workers=1, format_score=0.1) as rr:
        result = rr.score(items)
        np.testing.assert_allclose(result.scores, [1.0, 0.1, 0.0])
        assert result.metrics["reward/acc"] == pytest.approx(1 / 3)
        with pytest.raises(ConfigError, match="no built-in reward for data_source 'my/task'"):
            rr.check_data_sources(["openai/gsm8k", "my/task"])
    with RewardRunner("gsm8k", tmp_path, timeout_s=5, on_error="fail", workers=1) as rr:
        rr.check_data_sources(["my/task"])  # a named built-in scores any data source
        assert rr.score([{**items[0], "data_source": "my/task"}]).scores.tolist() == [1.0]


BROKEN = {
    "missing file": ("nope.py:compute_score", None, "does not exist"),
    "syntax error": ("bad.py:compute_score", "def compute_score(:\n", "syntax error in .* line 1"),
    "import error": ("bad.py:compute_score", "import not_a_module_xyz\n", "ModuleNotFoundError"),
    "missing function": ("bad.py:compute_score", "def other(a, b, c, d):\n    return 1\n",
                         "has no 'compute_score'.*other"),
    "not callable": ("bad.py:compute_score", "compute_score = 3\n", "compute_score is 3, not a function"),
    "wrong signature": ("bad.py:compute_score", "def compute_score(solution_str):\n    return 1\n",
                        r"signature compute_score\(solution_str\)"),
    "async": ("bad.py:compute_score", "async def compute_score(a, b, c, d=None):\n    return 1\n", "is async"),
    "no function name": ("bad.py", "", "is not \"file.py:function\""),
    "unknown built-in": ("gsm9k", None, "unknown built-in reward 'gsm9k'"),
}


@pytest.mark.parametrize("case", list(BROKEN))
def test_broken_reward_functions_are_config_errors_at_startup(tmp_path, case):
    spec, source, pattern = BROKEN[case]
    if source is not None:
        (tmp_path / "bad.py").write_text(source)
    with pytest.raises(ConfigError, match=pattern) as info:
        RewardRunner(spec, tmp_path, timeout_s=5, on_error="fail", workers=1)
    assert info.value.exit_code == 2
    assert "\n" not in info.value.message
    if spec.endswith(":compute_score"):
        assert spec.split(":")[0] in info.value.message and "compute_score" in info.value.message


@pytest.mark.slow
def test_close_stops_the_workers(project):
    rr = RewardRunner("reward.py:compute_score", project, timeout_s=5, on_error="zero", workers=2)
    rr.score(items_for(["42"]))
    processes = [w.process for w in rr._workers]
    rr.close()
    rr.close()
    assert not any(p.is_alive() for p in processes)
    with pytest.raises(RuntimeError, match="after close"):
        rr.score(items_for(["42"]))
