"""A new rollout kind is its Rollout class plus one row of the rollout table (rlctl.rollouts.table):
tests/support/toy_rollout.py's row, added to the table, is what `rlctl train` builds the policy's
rollout from, validated by the same checks, and its own reward trains a step."""

from __future__ import annotations

import json

import pytest

from rlctl.config.loader import load_config

ONE_STEP = ["run.name=toy-rollout", "run.total_steps=1", "run.save_every=0", "data.val_files=[]",
            "resources.workers=1", "data.batch_size=2", "rollout.n=2", "actor.mini_batch_size=2",
            "actor.micro_batch_size=4"]


@pytest.mark.slow
def test_a_toy_rollout_kind_added_by_one_row_trains_a_step(tmp_path, make_project, ray_cluster, monkeypatch):
    import support.toy_rollout as toy
    from rlctl.controller.run import start_training
    from rlctl.rollouts import table

    monkeypatch.setattr(table, "KINDS", table.KINDS + (toy.TOY,))
    proj = make_project(tmp_path / "p", "grpo-arith-cpu")
    loaded = load_config(proj / "rlctl.toml", ONE_STEP)
    assert table.kind_of(loaded.config) is toy.TOY
    start_training(loaded, address=None, force=False)
    (step,) = [json.loads(line) for line in (proj / "runs" / "toy-rollout" / "metrics.jsonl").read_text().splitlines()
               if "toy/even_share" in line]
    assert step["step"] == 1 and step["reward/mean"] == pytest.approx(step["toy/even_share"], abs=1e-6)
    assert "actor/pg_loss" in step   # the update ran on the toy kind's rows
