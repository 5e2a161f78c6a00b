"""The pass table (rlctl.controller.passes): one row per pass a column of rlctl.algorithms.COLUMNS
names, and a run runs the rows its needs (and, for the optional columns, its config) name."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

from rlctl.algorithms import COLUMNS, Needs, algorithm_needs
from rlctl.config import schema
from rlctl.controller.passes import PASSES, run_passes


def _ran(needs: Needs, *, recompute: bool = False, teachers=None, bypass: bool = False) -> list[str]:
    c = schema.Config()
    algo = dataclasses.replace(c.algorithm, rollout_correction=dataclasses.replace(
        c.algorithm.rollout_correction, bypass_mode=bypass))
    setup = SimpleNamespace(needs=needs, recompute_old_log_prob=recompute, teachers=teachers,
                            config=dataclasses.replace(c, algorithm=algo))
    return [p.name for p in run_passes(setup)]


def test_every_pass_a_column_names_has_one_row():
    assert sorted({c.made_by for c in COLUMNS.values()}) == sorted(p.name for p in PASSES)
    # a pass a reader starts is a field of Needs (what run_needs hands the roles and the loop)
    started = {c.made_by for c in COLUMNS.values() if not c.optional} - {"rollout"}
    assert started <= {f.name for f in dataclasses.fields(Needs)}


def test_a_run_runs_the_passes_its_columns_name_in_order():
    assert _ran(algorithm_needs("grpo")) == []   # on-policy, one update: no pass before the advantages
    assert _ran(algorithm_needs("grpo", use_kl_loss=True), recompute=True) == [
        "old_log_prob", "rollout_correction", "reference"]
    assert _ran(algorithm_needs("gae"), recompute=True) == ["old_log_prob", "rollout_correction", "critic"]
    assert _ran(algorithm_needs("remax")) == ["greedy_baseline"]
    assert _ran(algorithm_needs("prime"), recompute=True)[-1] == "implicit_prm"
    assert "real_response" in _ran(algorithm_needs("spin"))
    assert _ran(algorithm_needs("grpo"), teachers=object()) == ["teacher"]          # distill: the config's
    assert _ran(algorithm_needs("grpo"), bypass=True) == ["old_log_prob"]           # the rollout's log-probs
    [critic] = [p for p in PASSES if p.name == "critic"]
    assert critic.train is not None and all(p.train is None for p in PASSES if p.name != "critic")
