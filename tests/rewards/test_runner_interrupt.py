"""A Ctrl-C reaches the whole process group, reward workers included, while they still start
(a spawned child imports the parent's main module first: typer, for `rlctl train`). Stopping is the
controller's call, so a worker must neither die of it nor print a KeyboardInterrupt traceback."""

from __future__ import annotations

import os
import signal
import time

import pytest

from rlctl.rewards.runner import RewardRunner


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_ctrl_c_while_a_reward_worker_starts_neither_kills_it_nor_prints_a_traceback(tmp_path, capfd):
    (tmp_path / "reward.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                        "    return float(solution_str == ground_truth)\n")
    with RewardRunner("reward.py:compute_score", tmp_path, timeout_s=30, workers=1) as rr:
        pid = rr._workers[0].process.pid
        end = time.monotonic() + 2.0   # from its first instruction through its imports
        while time.monotonic() < end:
            os.kill(pid, signal.SIGINT)
            time.sleep(0.005)
        result = rr.score([{"data_source": "toy", "solution_str": "4", "ground_truth": "4"}])
        assert rr._workers[0].process.pid == pid   # the same worker, never replaced
    assert result.scores.tolist() == [1.0]
    err = capfd.readouterr().err
    assert "KeyboardInterrupt" not in err and "Traceback" not in err, err


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_worker_whose_controller_ended_before_it_was_ready_exits_without_a_traceback(tmp_path, capfd):
    """A stop can end the controller while a worker still imports; its "ready" then meets a closed
    pipe (BrokenPipeError), which is no error of the user's."""
    (tmp_path / "reward.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                        "    return 1.0\n")
    rr = RewardRunner("reward.py:compute_score", tmp_path, timeout_s=30, workers=1)
    worker = rr._workers[0]
    worker.conn.close()   # the controller's end of the pipe, gone before the worker says it is ready
    worker.process.join(60)
    rr.close()
    assert worker.process.exitcode == 0
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BrokenPipeError" not in err, err
