"""Failed agent episodes said out loud: the reason on their rows (a context-length refusal naming the keys to
raise), one console line per step with each reason's count, the rollouts dump and `rlctl view` showing the
reason, and 3 steps in a row in which every episode failed stopping the run (exit 5). Plain data, fast."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlctl.agent.episodes import CONTEXT_LENGTH, Call, Episode
from rlctl.agent.failures import CONTEXT_REASON, FailureWatch
from rlctl.agent.rollout import agent_metrics, episode_batch, episode_record, first_rows, pad_rows, score_episodes
from rlctl.controller.rollout_log import rollout_records
from rlctl.errors import RewardError
from rlctl.runtime.batch import Batch, object_array

REFUSED = "raised BadRequestError: Error code: 400 - this call's prompt has 186 tokens and leaves no room"


def episode(index: int, failure: str = "", refused: str = "") -> Episode:
    ep = Episode(index=index, row={}, failure=failure, refused=refused)
    if not failure:
        ep.record(Call([5, 6], [1, 2], [-0.5, -0.5], "stop", merged=False))
        ep.record(Call([9], [3], [-0.5], "stop", merged=False))     # two rows: counted once all the same
        ep.reward, ep.answer = 1.0, "4"
    return ep


def rollout(episodes: list[Episode]) -> Batch:
    prompts = Batch({"input_ids": np.array([[0, 5, 6]]), "attention_mask": np.array([[0, 1, 1]]),
                     "uid": object_array(["u0"]), "data_source": object_array(["d"]),
                     "ground_truth": object_array(["4"]), "extra_info": object_array([{}]),
                     "messages": object_array([[{"role": "user", "content": "2+2?"}]])})
    out = pad_rows(episode_batch(prompts, episodes, len(episodes), width=4, response_width=6, pad=0,
                                 log_probs=False), 8)
    out.meta.update(agent_reward_mode="agent", agent_metrics=agent_metrics(episodes))
    score_episodes(out, reward_runner=None)
    return out


def failures(batch: Batch) -> list[str]:
    return batch["agent_failure"][first_rows(batch)].tolist()   # one per episode, as the trainer hands them


def failing(n: int = 4) -> list[str]:
    refused = [episode(i, REFUSED, CONTEXT_LENGTH) for i in range(n - 1)]
    return failures(rollout(refused + [episode(n - 1, "timeout")]))


def test_each_step_says_its_failures_in_one_line_with_each_reason_and_count():
    said = []
    watch = FailureWatch(said.append)
    watch.step(1, failures(rollout([episode(0), episode(1, "timeout"), episode(2, "timeout"),
                                    episode(3, REFUSED, CONTEXT_LENGTH)])))
    watch.step(2, failures(rollout([episode(i) for i in range(4)])))        # nothing failed: nothing said
    assert said == [f"step 1: 3 of 4 agent episodes failed: timeout (x2); {CONTEXT_REASON} (x1)"]
    assert "data.max_prompt_length" in said[0] and "data.max_response_length" in said[0]


def test_the_agent_kind_watches_each_trained_batch_once_per_episode():
    """AgentPrograms.watch (what the trainer calls after each scored batch) hands FailureWatch one reason per
    episode: the padding rows and an episode's second row are not counted."""
    from types import SimpleNamespace

    from rlctl.agent.rollout import AgentPrograms

    said, kind = [], SimpleNamespace(failures=None)
    batch = rollout([episode(0), episode(1, "timeout")])   # 3 rows + 5 padding rows
    AgentPrograms.watch(kind, 7, batch, said.append)
    assert said == ["step 7: 1 of 2 agent episodes failed: timeout (x1)"]
    for step in (8, 9):
        AgentPrograms.watch(kind, step, rollout([episode(0, "timeout")]), said.append)
    with pytest.raises(RewardError):   # the same watch across steps: three all-failed steps in a row
        AgentPrograms.watch(kind, 10, rollout([episode(0, "timeout")]), said.append)


def test_three_steps_in_a_row_of_only_failed_episodes_stop_the_run_with_exit_5():
    said = []
    watch = FailureWatch(said.append)
    watch.step(1, failing())
    watch.step(2, failures(rollout([episode(0), episode(1, "timeout")])))   # one episode trained: count restarts
    watch.step(3, failing())
    watch.step(4, failing())
    with pytest.raises(RewardError) as stop:
        watch.step(5, failing())
    assert stop.value.exit_code == 5 and len(said) == 5
    assert "every agent episode failed in 3 steps in a row (steps 3-5)" in stop.value.message
    assert f"12 of 12 agent episodes failed: {CONTEXT_REASON} (x9); timeout (x3)" in stop.value.message


def test_the_rollouts_dump_and_rlctl_view_show_a_failed_episodes_reason(tmp_path):
    from rlctl.view.data import load_source
    from rlctl.view.html import report_data
    from rlctl.view.samples import parse_filter
    from rlctl.view.screens import conversation_text

    batch = rollout([episode(0), episode(1, REFUSED, CONTEXT_LENGTH)])
    records = rollout_records(batch.select(np.flatnonzero(batch["agent_episode"] >= 0)), episode_record)
    assert [r["agent_episode"] for r in records] == [0, 0, 1]
    assert "agent_failure" not in records[0] and records[2]["agent_failure"].startswith(CONTEXT_REASON)
    assert REFUSED in records[2]["agent_failure"]                           # what the agent reported, after it
    run = tmp_path / "run"
    (run / "rollouts").mkdir(parents=True)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    (run / "rollouts" / "step_1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    view = load_source(run)
    failed = view.samples[2]
    assert failed["failure"].startswith(CONTEXT_REASON) and not view.samples[0]["failure"]
    assert "episode failed: " + CONTEXT_REASON in conversation_text(view, failed, "off").plain
    found = parse_filter("context_length_exceeded")                      # the filter box finds a reason's words
    assert found(failed) and not found(view.samples[0])
    page = report_data(view)
    assert page["samples"][2][page["fields"].index("failure")] == failed["failure"]
