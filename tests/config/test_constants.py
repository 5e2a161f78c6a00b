"""Names the config schema repeats so that it stays free of torch: they must equal the originals."""

from __future__ import annotations

from rlctl.algorithms.aggregation import LOSS_AGG_MODES
from rlctl.algorithms.kl import KL_KINDS
from rlctl.config import schema


def test_schema_choices_equal_the_algorithms_names():
    # rlctl.algorithms imports torch; `rlctl config validate` and `--help` must not, so the schema keeps copies
    assert schema.LOSS_AGG_MODES == LOSS_AGG_MODES
    assert schema.KL_TYPES == KL_KINDS


def test_schema_estimators_are_the_built_in_ones():
    from rlctl.algorithms import estimator_names

    assert set(schema.ADV_ESTIMATORS) == set(estimator_names())


def test_schema_policy_losses_are_the_built_in_ones():
    import dataclasses

    from rlctl.algorithms import policy_loss_names

    field = next(f for f in dataclasses.fields(schema.ActorConfig) if f.name == "policy_loss")
    assert set(field.metadata["choices"]) == set(policy_loss_names())
