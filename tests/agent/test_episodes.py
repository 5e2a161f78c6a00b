"""The merge rule, the sequence budget, rows and rewards of agent episodes, and [rollout.agent]'s checks:
plain data, hand-computed cases."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from rlctl.agent.checks import check_agent
from rlctl.agent.episodes import Call, Episode, layout
from rlctl.agent.rollout import agent_metrics, episode_batch, pad_rows, score_episodes
from rlctl.agent.runner import _take_result, plain
from rlctl.config.checks import CheckContext
from rlctl.config.schema import Config
from rlctl.rollouts.checks import check_rollout_kind
from rlctl.runtime.batch import Batch, object_array


def call(ep: Episode, prompt: list[int], completion: list[int]) -> Call:
    c = Call(prompt, completion, [-0.5] * len(completion), "stop", merged=ep.continues(prompt))
    ep.record(c)
    return c


def test_a_prompt_that_continues_the_last_call_merges_with_its_new_tokens_masked():
    ep = Episode(index=0, row={})
    call(ep, [1, 2, 3], [10, 11])
    second = call(ep, [1, 2, 3, 10, 11, 7, 8], [12])     # 7, 8: a tool answer between the calls
    assert second.merged and len(ep.sequences) == 1
    seq = ep.sequences[0]
    assert seq.prompt_ids == [1, 2, 3] and seq.response_ids == [10, 11, 7, 8, 12]
    assert seq.response_mask == [1, 1, 0, 0, 1] and seq.log_probs == [-0.5, -0.5, 0.0, 0.0, -0.5]


def test_a_rewritten_or_retokenised_history_is_a_sequence_of_its_own():
    ep = Episode(index=0, row={})
    call(ep, [1, 2, 3], [10, 11])
    assert not call(ep, [1, 2, 3, 10, 99, 7], [12]).merged   # 99: the completion re-tokenised differently
    assert not call(ep, [5, 6], [13]).merged                 # a trimmed history
    assert [s.prompt_ids for s in ep.sequences] == [[1, 2, 3], [1, 2, 3, 10, 99, 7], [5, 6]]
    assert agent_metrics([ep])["agent/merged"] == 0.0 and agent_metrics([ep])["agent/sequences"] == 3.0


def test_the_budget_keeps_every_sequence_within_one_row():
    ep = Episode(index=0, row={})
    assert ep.budget([1] * 10, prompt_length=8, response_length=6) == 4       # 8 in the prompt part, 2 + 4 after
    call(ep, [1] * 6, [2] * 3)
    assert ep.budget([1] * 6 + [2] * 3 + [3] * 2, 8, 6) == 6 + 6 - 11       # the chain's first prompt: 6 tokens
    assert ep.budget([9] * 20, 8, 6) <= 0                                    # a new sequence too long for a row
    head, tail, mask, lps = layout(ep.sequences[0], prompt_length=4)         # a prompt longer than the prompt part
    assert head == [1] * 4 and tail == [1, 1, 2, 2, 2] and mask == [0, 0, 1, 1, 1] and lps[:2] == [0.0, 0.0]


@pytest.mark.parametrize("result, reward, failure", [
    (1.5, 1.5, ""), ({"reward": 0.25, "draft": 1.0}, 0.25, ""), (None, None, "returned no reward"),
    ({"score": 1.0}, None, "returned no reward"), (math.nan, None, "returned reward nan"),
    ("1", None, "returned a str as its reward, not a number"), (True, None, "returned a bool as its reward, not a number"),
])
def test_what_an_agent_returns(result, reward, failure):
    ep = Episode(index=0, row={})
    _take_result(ep, result)
    assert ep.reward == reward and ep.failure == failure
    if isinstance(result, dict) and reward is not None:
        assert ep.metrics == {"draft": 1.0}


def prompts(n_prompts: int) -> Batch:
    ids = np.array([[0, 5, 6], [7, 8, 9]][:n_prompts], dtype=np.int64)
    return Batch({"input_ids": ids, "attention_mask": (ids != 0).astype(np.int64),
                  "uid": object_array([f"u{i}" for i in range(n_prompts)]),
                  "data_source": object_array(["d"] * n_prompts), "ground_truth": object_array(["4"] * n_prompts),
                  "extra_info": object_array([{}] * n_prompts), "messages": object_array([[]] * n_prompts)})


def test_episode_rows_carry_their_prompts_group_and_reward():
    a, b, c, d = (Episode(index=i, row={}) for i in range(4))
    call(a, [5, 6], [1, 2])
    call(a, [5, 6, 1, 2, 3], [4])                 # one merged sequence
    call(b, [5, 6], [1])
    call(b, [9], [2])                             # split: two rows
    a.reward, b.reward, c.failure = 1.0, 0.5, "timeout"   # c: failed before any call; d: no call, no reward
    out = episode_batch(prompts(2), [a, b, c, d], 2, width=4, response_width=5, pad=0, log_probs=False)
    assert len(out) == 5 and out["uid"].tolist() == ["u0", "u0", "u0", "u1", "u1"]
    assert out["agent_episode"].tolist() == [0, 1, 1, 2, 3]
    assert out["prompts"][0].tolist() == [0, 0, 5, 6] and out["responses"][0].tolist() == [1, 2, 3, 4, 0]
    assert out["response_mask"][0].tolist() == [1, 1, 0, 1, 0]
    assert out["response_mask"][3].sum() == 0 and out["prompts"][3].tolist() == [0, 7, 8, 9]  # c: its prompt, nothing
    assert np.isnan(out["agent_reward"][3]) and out["agent_reward"][:3].tolist() == [1.0, 0.5, 0.5]
    assert "rollout_log_prob" not in out
    padded = pad_rows(out, 4)
    assert len(padded) == 8 and padded["response_mask"][5:].sum() == 0
    assert len(set(padded["uid"][5:].tolist())) == 3 and padded["agent_episode"][5:].tolist() == [-1] * 3
    out.meta.update(agent_reward_mode="agent", agent_metrics=agent_metrics([a, b, c, d]))
    metrics = score_episodes(out, reward_runner=None)
    assert out["scores"].tolist() == [1.0, 0.5, 0.5, 0.0, 0.0]
    assert metrics["agent/failed"] == 0.25 and metrics["agent/calls"] == 1.0


def test_plain_turns_parquet_values_into_json():
    row = plain({"a": np.array([1, 2]), "b": {"c": np.float32(0.5)}, "d": (np.int64(3),)})
    assert row == {"a": [1, 2], "b": {"c": 0.5}, "d": [3]}


def agent_config(**agent) -> Config:
    base = Config()
    return dataclasses.replace(base, rollout=dataclasses.replace(base.rollout, **{
        k: v for k, v in agent.items() if k != "agent"}, agent=dataclasses.replace(base.rollout.agent, **agent["agent"])))


def test_what_agent_rollouts_are_not_built_with_is_refused_in_one_line_each(tmp_path):
    ctx = CheckContext(base_dir=tmp_path, raw={}, machine=False)
    assert check_agent(Config(), ctx) == []
    both = check_agent(agent_config(agent={"function": "a.py:run", "command": ("x",)}), ctx)
    assert [p.key for p in both] == ["rollout.agent.command"]
    c = agent_config(agent={"function": "a.py:run"}, mode="one_step_off")
    c = dataclasses.replace(c, rollout=dataclasses.replace(c.rollout, multi_turn=dataclasses.replace(
        c.rollout.multi_turn, enable=True)), algorithm=dataclasses.replace(c.algorithm, name="remax"))
    assert check_agent(c, ctx) == []   # what agent programs are built with is their row of the rollout table
    keys = [p.key for p in check_rollout_kind(c, ctx)]
    assert keys == ["rollout.multi_turn.enable", "rollout.mode", "rollout.agent.function"]
    pf = agent_config(agent={"function": "a.py:run"})
    pf = dataclasses.replace(pf, algorithm=dataclasses.replace(pf.algorithm, use_pf_ppo=True))
    assert [p.key for p in check_rollout_kind(pf, ctx)] == ["algorithm.use_pf_ppo"]


def test_the_machine_pass_loads_the_agent(tmp_path):
    ctx = CheckContext(base_dir=tmp_path, raw={}, machine=True)
    (tmp_path / "sync.py").write_text("def run(client, row):\n    return 1.0\n")
    (tmp_path / "ok.py").write_text("async def run(client, row):\n    return 1.0\n")
    problems = check_agent(agent_config(agent={"function": "sync.py:run"}), ctx)
    assert len(problems) == 1 and "is not an async function" in problems[0].message
    assert check_agent(agent_config(agent={"function": "ok.py:run"}), ctx) == []
    missing = check_agent(agent_config(agent={"command": ("no-such-program-here",)}), ctx)
    assert len(missing) == 1 and "neither a file" in missing[0].message
