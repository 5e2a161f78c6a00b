"""Names the config schema repeats so that it stays free of torch: they must equal the originals."""

from __future__ import annotations

import json
import subprocess
import sys

from rlctl.algorithms.aggregation import LOSS_AGG_MODES
from rlctl.algorithms.kl import KL_KINDS
from rlctl.algorithms.pf_ppo import REWEIGHT_METHODS
from rlctl.config import schema


def test_schema_choices_equal_the_algorithms_names():
    # rlctl.algorithms imports torch; `rlctl config validate` and `--help` must not, so the schema keeps copies
    assert schema.LOSS_AGG_MODES == LOSS_AGG_MODES
    assert schema.KL_TYPES == KL_KINDS
    assert schema.PF_PPO_REWEIGHT_METHODS == REWEIGHT_METHODS


def built_in(names: str) -> set[str]:
    """The registry's names as a fresh import has them: other tests register their own in this process."""
    code = f"import json, rlctl.algorithms as a; print(json.dumps(a.{names}()))"
    return set(json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                         check=True).stdout))


def test_schema_estimators_are_the_built_in_ones():
    assert set(schema.ADV_ESTIMATORS) == built_in("estimator_names")


def test_schema_policy_losses_are_the_built_in_ones():
    import dataclasses

    field = next(f for f in dataclasses.fields(schema.ActorConfig) if f.name == "policy_loss")
    assert set(field.metadata["choices"]) == built_in("policy_loss_names")
