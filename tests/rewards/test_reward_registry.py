"""The reward-source registry: one entry per source, read by build_reward, validate and eval."""

from __future__ import annotations

import dataclasses

import pytest

from rlctl.config.schema import REWARD_SOURCES, RewardConfig
from rlctl.rewards.registry import SOURCES, configured
from rlctl.rewards.sources import configured_names


def test_schema_weights_keys_are_the_registered_sources():
    # config.schema keeps a copy (config imports nothing of rewards): reward.weights accepts these
    assert set(REWARD_SOURCES) == {entry.name for entry in SOURCES}


@pytest.mark.parametrize("settings, names", [
    ({}, ["function"]),                                            # the built-ins by data_source
    ({"judge_url": "http://j/v1"}, ["judge"]),                     # another source: no fallback
    ({"judge_url": "http://j/v1", "weights": {"function": 1.0}}, ["function", "judge"]),
    ({"model": "rm", "remote_url": "http://r", "function": "r.py:f"}, ["function", "remote", "model"]),
])
def test_which_sources_are_on(settings, names):
    reward = dataclasses.replace(RewardConfig(), **settings)
    assert configured_names(reward) == names == [entry.name for entry in configured(reward)]


def test_every_source_but_the_reward_model_is_built_here():
    # the reward model joins once its workers run (RewardSources.attach_model)
    assert [entry.name for entry in SOURCES if entry.build is None] == ["model"]
    assert [entry.name for entry in SOURCES if entry.base] == ["function"]
