"""Names the config schema repeats so that it stays free of torch: they must equal the originals."""

from __future__ import annotations

from rlctl.algorithms.aggregation import LOSS_AGG_MODES
from rlctl.algorithms.kl import KL_KINDS
from rlctl.algorithms.pf_ppo import REWEIGHT_METHODS
from rlctl.config import algorithm_tables, schema


def test_schema_choices_equal_the_algorithms_names():
    # rlctl.algorithms imports torch; `rlctl config validate` and `--help` must not, so the schema keeps copies
    assert schema.LOSS_AGG_MODES == LOSS_AGG_MODES
    assert schema.KL_TYPES == KL_KINDS
    assert algorithm_tables.PF_PPO_REWEIGHT_METHODS == REWEIGHT_METHODS   # [algorithm.pf_ppo] lives there


def built_in(kind: str) -> set[str]:
    """The registry's names that rlctl itself registers: other tests register their own (plugins,
    planted losses) in this process, from modules outside rlctl.algorithms."""
    from rlctl import algorithms
    from rlctl.algorithms import registry

    names, get = {"estimator": (algorithms.estimator_names, registry.get_estimator),
                  "policy_loss": (algorithms.policy_loss_names, registry.get_policy_loss)}[kind]
    return {n for n in names() if get(n).fn.__module__.startswith("rlctl.algorithms.")}


def test_schema_estimators_are_the_built_in_ones():
    assert set(schema.ADV_ESTIMATORS) == built_in("estimator")


def test_schema_policy_losses_are_the_built_in_ones():
    import dataclasses

    field = next(f for f in dataclasses.fields(schema.ActorConfig) if f.name == "policy_loss")
    assert set(field.metadata["choices"]) == built_in("policy_loss")
