"""An LLM judge: `rlctl serve` of a tiny model on loopback grades responses over the OpenAI API."""

from __future__ import annotations

import dataclasses

import pytest
from support.reward_server import JudgeServer, build_digit_judge

from rlctl.config.schema import RewardConfig
from rlctl.errors import ConfigError, RewardError
from rlctl.rewards.remote import score_reader
from rlctl.rewards.sources import build_reward

KEY = "judge-key-1"
ITEMS = [{"data_source": "x", "solution_str": f"answer {i}", "ground_truth": str(i), "extra_info": None,
          "prompt_str": "", "messages": [{"role": "user", "content": f"what is {i} + 0?"}]} for i in range(6)]


@pytest.fixture(scope="module")
def digit_judge(tmp_path_factory):
    folder = tmp_path_factory.mktemp("judge7")
    build_digit_judge(folder)
    with JudgeServer(folder, api_key=KEY) as server:
        yield server


def _cfg(url: str, **kw) -> RewardConfig:
    return dataclasses.replace(RewardConfig(), judge_url=url, judge_model="judge",
                               judge_api_key_env="RLCTL_TEST_JUDGE_KEY", judge_max_tokens=3, **kw)


@pytest.mark.slow
def test_judge_answers_are_parsed(digit_judge, tmp_path, monkeypatch):
    monkeypatch.setenv("RLCTL_TEST_JUDGE_KEY", KEY)
    with build_reward(_cfg(digit_judge.url, weights={"judge": 0.1}), tmp_path) as reward:
        result = reward.score(ITEMS)
        judge = reward.others[0]
        answers = [judge._ask(it) for it in ITEMS]  # the same requests again: greedy, so the same answers
    assert all(set(a) <= {"3", "7"} and len(a) == 3 for a in answers), answers
    assert result.scores.tolist() == pytest.approx([0.1 * float(a) for a in answers])
    assert result.metrics["reward/judge/mean"] == pytest.approx(sum(map(float, answers)) / len(answers))
    assert result.metrics["reward/judge/errors"] == 0


@pytest.mark.slow
def test_judge_needs_the_key_from_the_environment(digit_judge, tmp_path, monkeypatch):
    monkeypatch.delenv("RLCTL_TEST_JUDGE_KEY", raising=False)
    with build_reward(_cfg(digit_judge.url, retries=0), tmp_path) as reward:
        with pytest.raises(RewardError, match="HTTP 401"):
            reward.score(ITEMS)


@pytest.mark.slow
def test_unparseable_answer_follows_on_error(digit_judge, tmp_path, monkeypatch):
    monkeypatch.setenv("RLCTL_TEST_JUDGE_KEY", KEY)
    no_score = r"Score: (\d+)"  # the judge answers bare digits: nothing to read
    with build_reward(_cfg(digit_judge.url, judge_score=no_score), tmp_path) as reward:
        with pytest.raises(RewardError, match=r"'judge' failed on sample 0 .*the judge's answer has no score"):
            reward.score(ITEMS)
    with build_reward(_cfg(digit_judge.url, judge_score=no_score, on_error="zero"), tmp_path) as reward:
        with pytest.raises(RewardError, match="failed on 6 of 6 samples"):  # more than half, even with "zero"
            reward.score(ITEMS)
        assert reward.score(ITEMS[:0]).scores.size == 0


def test_judge_down_at_start_and_bad_settings_are_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="reward.judge_url: nothing answers at 127.0.0.1:9"):
        build_reward(_cfg("http://127.0.0.1:9/v1"), tmp_path)
    with pytest.raises(ConfigError, match="judge_model is empty"):
        build_reward(dataclasses.replace(_cfg("http://127.0.0.1:9/v1"), judge_model=""), tmp_path)
    with pytest.raises(ConfigError, match="no \\{response\\}"):
        build_reward(_cfg("http://127.0.0.1:9/v1", judge_prompt="grade {question}"), tmp_path)


@pytest.mark.parametrize("spec, text, expected", [
    ("last_number", "Reasoning: 3 of 4 steps are right.\nScore: 8", 8.0),
    ("first_number", "7/10 because", 7.0),
    ("last_number", "score -0.5", -0.5),
    ("last_number", "no digits here", None),
    (r"Score:\s*(\d+(?:\.\d+)?)", "I give 3 points. Score: 9.5/10", 9.5),
    (r"Score:\s*(\d+)", "Score: none", None),
])
def test_score_reader(spec, text, expected):
    assert score_reader(spec)(text) == expected
