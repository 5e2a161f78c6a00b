"""The rollout engine registry: declarations match the engines and the config schema."""

from __future__ import annotations

import dataclasses

import pytest

from rlctl.config.schema import RolloutConfig
from rlctl.errors import UsageError
from rlctl.workers.rollout.base import RolloutEngine
from rlctl.workers.rollout.registry import rollout_engine_info, rollout_engine_names, sharding_engines


def test_schema_choices_are_the_registered_engines():
    field = next(f for f in dataclasses.fields(RolloutConfig) if f.name == "engine")
    assert tuple(field.metadata["choices"]) == rollout_engine_names()


@pytest.mark.parametrize("name", rollout_engine_names())
def test_declaration_matches_the_engine_class(name):
    info = rollout_engine_info(name)
    engine = info.load()   # imports the module only: vLLM / SGLang themselves load in __init__
    assert issubclass(engine, RolloutEngine)
    assert engine.owns_weights == info.owns_weights
    assert not info.gpu_only or info.owns_weights   # a GPU engine cannot run the trainer's CPU module


def test_unknown_engine_is_a_usage_error_naming_the_known_ones():
    with pytest.raises(UsageError, match="unknown rollout engine 'tgi'") as err:
        rollout_engine_info("tgi")
    assert all(name in err.value.hint for name in rollout_engine_names())
    assert sharding_engines() == ("vllm",)
