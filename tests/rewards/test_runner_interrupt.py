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
