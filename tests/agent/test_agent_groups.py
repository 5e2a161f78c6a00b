"""Groups are episodes, through the controller: agent episodes as episode_batch makes them rows, scored by
score_episodes, advantages by the controller's compute_advantages, reward metrics by the trainer's.
Plain data, hand-computed cases (the issue's numbers)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from rlctl.agent.episodes import Call, Episode
from rlctl.agent.rollout import agent_metrics, episode_batch, first_groups, first_rows, pad_rows, score_episodes
from rlctl.controller.rollout import sampling_filter
from rlctl.config.schema import Config
from rlctl.controller.advantage import compute_advantages
from rlctl.controller.trainer import reward_metrics
from rlctl.runtime.batch import Batch, object_array


def played(index: int, reward: float, calls: list[tuple[list[int], list[int]]]) -> Episode:
    ep = Episode(index=index, row={})
    for prompt, completion in calls:
        ep.record(Call(prompt, completion, [-0.5] * len(completion), "stop", merged=ep.continues(prompt)))
    ep.reward = reward
    return ep


def rows_of(episodes: list[Episode], n: int, pad_to: int = 1, uids: tuple = ("u0",)) -> Batch:
    k = len(uids)
    prompts = Batch({"input_ids": np.array([[0, 5, 6]] * k), "attention_mask": np.array([[0, 1, 1]] * k),
                     "uid": object_array(list(uids)), "data_source": object_array(["d"] * k),
                     "ground_truth": object_array(["4"] * k), "extra_info": object_array([{}] * k),
                     "messages": object_array([[]] * k)})
    out = pad_rows(episode_batch(prompts, episodes, n, width=4, response_width=6, pad=0, log_probs=False), pad_to)
    out.meta.update(agent_reward_mode="agent", agent_metrics=agent_metrics(episodes))
    score_episodes(out, reward_runner=None)
    return out


def grpo() -> Config:
    base = Config()
    return dataclasses.replace(base, algorithm=dataclasses.replace(base.algorithm, name="grpo", norm_adv_by_std=True))


def test_an_episode_split_into_three_rows_counts_once():
    won = played(0, 1.0, [([5, 6], [1, 2])])
    lost = played(1, 0.0, [([5, 6], [1]), ([9], [2]), ([8, 8], [3, 4])])    # history rewritten twice: 3 rows
    batch = rows_of([won, lost], 2, pad_to=8)                                # + 4 padding rows
    assert batch["agent_episode"].tolist() == [0, 1, 1, 1, -1, -1, -1, -1]
    compute_advantages(batch, grpo(), None)
    adv, mask = batch["advantages"], batch["response_mask"] > 0
    assert np.allclose(adv[0][mask[0]], 1 / math.sqrt(2), atol=1e-5)
    for r in (1, 2, 3):
        assert np.allclose(adv[r][mask[r]], -1 / math.sqrt(2), atol=1e-5)
    assert not adv[4:].any()
    assert reward_metrics(batch, first_rows(batch)) == {"reward/mean": 0.5, "reward/std": 0.5, "reward/acc": 0.5}


def test_episodes_that_made_no_call_count_in_their_group():
    # (1, 1, 0, 0): the 1s answered without calling the model (one row each, nothing to train)
    episodes = [played(0, 1.0, []), played(1, 1.0, []), played(2, 0.0, [([5, 6], [1, 2])]),
                played(3, 0.0, [([5, 6], [3])])]
    batch = rows_of(episodes, 4)
    assert batch["response_mask"][:2].sum() == 0
    compute_advantages(batch, grpo(), None)
    adv, mask = batch["advantages"], batch["response_mask"] > 0
    assert np.allclose(adv[mask], -0.5 / math.sqrt(1 / 3), atol=1e-5)     # -0.866 on every calling token
    assert reward_metrics(batch, first_rows(batch))["reward/mean"] == 0.5


def test_dynamic_sampling_keeps_whole_groups_of_episodes_from_several_rounds():
    split = [([5, 6], [1]), ([9], [2])]                  # every episode: two rows
    ds = Config().algorithm.dynamic_sampling
    first = rows_of([played(0, 1.0, split), played(1, 0.0, split), played(2, 1.0, split), played(3, 1.0, split)],
                    2, uids=("r1-0", "r1-1"))
    keep = sampling_filter(first, ds)                    # r1-1's two episodes both scored 1: no spread
    assert keep.kept_groups == ("r1-0",) and keep.keep.tolist() == [True] * 4 + [False] * 4
    second = rows_of([played(0, 0.0, split), played(1, 1.0, split), played(2, 0.0, split), played(3, 1.0, split)],
                     2, uids=("r2-0", "r2-1"))
    joined = first_groups([first.select(np.flatnonzero(keep.keep)), second], 2)
    assert joined["uid"].tolist() == ["r1-0"] * 4 + ["r2-0"] * 4
    assert joined["agent_episode"].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]   # round 2 numbered after round 1
    compute_advantages(joined, grpo(), None)
    assert np.allclose(joined["advantages"][:, 0], [1 / math.sqrt(2)] * 2 + [-1 / math.sqrt(2)] * 4
                       + [1 / math.sqrt(2)] * 2, atol=1e-5)
