"""The remote reward service (OpenRLHF's protocol) and its faults, against a real HTTP server on loopback."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
from support.reward_server import RewardService, lowercase_share

from rlctl.config.schema import RewardConfig
from rlctl.errors import ConfigError, RewardError
from rlctl.rewards.sources import build_reward

ITEMS = [{"data_source": "x", "solution_str": text, "ground_truth": str(i), "extra_info": None,
          "prompt_str": f"<|im_start|>user\nq{i}<|im_end|>\n<|im_start|>assistant\n", "messages": None}
         for i, text in enumerate(["abc", "ABC", "aB", "zz9!", "", "hello World"] * 5)]


def _cfg(url: str, **kw) -> RewardConfig:
    return dataclasses.replace(RewardConfig(), remote_url=url, **kw)


def _free_port_url() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/get_reward"


def test_scores_come_from_the_service_in_openrlhf_shape(tmp_path):
    with RewardService() as service, build_reward(_cfg(service.url), tmp_path) as reward:
        assert reward.names == ["remote"]  # no function: the built-ins are off when another source is set
        result = reward.score(ITEMS)
    expected = [lowercase_share(it["solution_str"]) for it in ITEMS]
    assert result.scores.tolist() == pytest.approx(expected)
    assert result.metrics["reward/remote/mean"] == pytest.approx(sum(expected) / len(expected))
    # chunks go out concurrently, so the service may see them in any order: find the one holding item 0
    first = next(r for r in service.requests if r["labels"][0] == "0")
    assert set(first) == {"query", "prompts", "labels"}
    assert first["query"][0] == ITEMS[0]["prompt_str"] + "abc" and first["labels"][0] == "0"
    assert sum(len(r["query"]) for r in service.requests) == len(ITEMS)


@pytest.mark.slow
def test_weights_combine_with_a_function(tmp_path):
    (tmp_path / "r.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                   "    return float(len(solution_str))\n")
    cfg = _cfg("", function="r.py:compute_score", workers=1, weights={"function": 0.5, "remote": 2.0})
    with RewardService() as service:
        cfg = dataclasses.replace(cfg, remote_url=service.url)
        with build_reward(cfg, tmp_path) as reward:
            result = reward.score(ITEMS)
    for it, score in zip(ITEMS, result.scores):
        assert score == pytest.approx(0.5 * len(it["solution_str"]) + 2.0 * lowercase_share(it["solution_str"]),
                                      rel=1e-5)
    assert "reward/function/mean" in result.metrics and "reward/remote/mean" in result.metrics


def test_service_down_at_start_is_one_config_error(tmp_path):
    with pytest.raises(ConfigError, match=r"reward.remote_url: nothing answers at 127.0.0.1:\d+"):
        build_reward(_cfg(_free_port_url()), tmp_path)


def test_service_dying_mid_run_follows_on_error(tmp_path):
    with RewardService(fail_after=2) as service:
        with build_reward(_cfg(service.url, on_error="zero", retries=0), tmp_path) as reward:
            result = reward.score(ITEMS)  # 2 chunks of 16 and 14: both answered
            assert result.metrics["reward/remote/errors"] == 0
            with pytest.raises(RewardError, match="failed on 30 of 30 samples.*HTTP 500"):
                reward.score(ITEMS)  # every chunk fails: more than half, even with on_error = "zero"
        with build_reward(_cfg(service.url, retries=0), tmp_path) as reward:
            with pytest.raises(RewardError, match="reward source 'remote' failed on sample 0.*HTTP 500"):
                reward.score(ITEMS)


def test_half_a_batch_failing_scores_zero_with_on_error_zero(tmp_path):
    with RewardService(fail_after=1) as service:  # the first chunk (16 samples) answers, the second fails
        with build_reward(_cfg(service.url, on_error="zero", retries=0, concurrency=1), tmp_path) as reward:
            result = reward.score(ITEMS)
    assert result.metrics["reward/remote/errors"] == 14 and result.metrics["reward/errors"] == 14
    assert result.failed.tolist() == [False] * 16 + [True] * 14
    assert result.scores[16:].tolist() == [0.0] * 14


def test_slow_service_times_out(tmp_path):
    with RewardService(delay_s=1.5) as service:
        cfg = _cfg(service.url, timeout_s=0.3, retries=1)
        with build_reward(cfg, tmp_path) as reward:
            timed_out = r"no answer from .* within reward.timeout_s = 0.3 s \(after 2 tries\)"
            with pytest.raises(RewardError, match=timed_out):
                reward.score(ITEMS[:4])
    assert len(service.requests) == 2  # the retry went out too


@pytest.mark.slow
@pytest.mark.parametrize("key", ["remote_url", "sandbox_url"])
def test_train_with_service_down_is_a_one_line_error(tmp_path, tiny_model_dir, key):
    from rlctl.tasks.prep import PrepOptions, prepare
    from rlctl.project import write_project

    write_project(tmp_path, "grpo-arith-cpu", str(tiny_model_dir))
    prepare("arith", PrepOptions(out=tmp_path / "data" / "arith"))
    proc = subprocess.run([sys.executable, "-m", "rlctl", "train", str(tmp_path / "rlctl.toml"),
                           f"reward.{key}={_free_port_url()}"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and f"reward.{key}: nothing answers at 127.0.0.1" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_train_start_reaches_the_service_once(tmp_path, tiny_model_dir, monkeypatch):
    """The start-up checks (controller.run._check, the same as `config validate`) and the reward
    sources (build_reward) together connect to the service once, not once each."""
    import socket

    from rlctl.config.loader import load_config
    from rlctl.controller.run import _check
    from rlctl.tasks.prep import PrepOptions, prepare
    from rlctl.project import write_project

    write_project(tmp_path, "grpo-arith-cpu", str(tiny_model_dir))
    prepare("arith", PrepOptions(out=tmp_path / "data" / "arith"))
    with RewardService() as service:
        port = int(service.url.split(":")[2].split("/")[0])
        loaded = load_config(tmp_path / "rlctl.toml", [f"reward.remote_url={service.url}",
                                                       "resources.gpus_per_node=0"])
        probes, connect = [], socket.create_connection
        monkeypatch.setattr(socket, "create_connection",
                            lambda address, *a, **kw: probes.append(address) or connect(address, *a, **kw))
        _check(loaded)
        with build_reward(loaded.config.reward, loaded.base_dir):
            pass
    assert [p for p in probes if p[1] == port] == [("127.0.0.1", port)]
