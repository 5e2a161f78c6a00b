"""validate's checks of self-play (rlctl.validate.selfplay): every problem at once, each one line; the
shipped recipes pass them; a resume inside a SPIN iteration is refused with one line."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlctl.config.checks import CheckContext
from rlctl.config.loader import load_config
from rlctl.config.schema import (ActorConfig, AlgorithmConfig, Config, LoraConfig, ModelConfig, MultiTurnConfig,
                                 RolloutConfig, RunConfig)
from rlctl.controller.selfplay import check_resume_step, refresh_due
from rlctl.errors import CheckpointError
from rlctl.rollouts.checks import check_rollout_kind
from rlctl.validate.selfplay import check_selfplay

ROOT = Path(__file__).resolve().parents[2]


def problems(c: Config) -> list[tuple[str, str]]:
    found = check_selfplay(c, CheckContext(base_dir=Path("."), raw={}, machine=False))
    assert all("\n" not in p.message for p in found)
    return [(p.key, p.severity) for p in found]


@pytest.mark.parametrize("recipe", ["spin-arith-cpu", "sppo-arith-cpu"])
def test_recipes_pass(recipe):
    assert problems(load_config(ROOT / "recipes" / f"{recipe}.toml").config) == []


def test_grpo_without_self_play_has_no_problem():
    assert problems(Config()) == []


def test_spin_rules_all_reported():
    c = Config(algorithm=AlgorithmConfig(name="spin", ref_update_every=4), run=RunConfig(save_every=6),
               model=ModelConfig(lora=LoraConfig(rank=8)), actor=ActorConfig(loss_agg_mode="token-mean"),
               rollout=RolloutConfig(multi_turn=MultiTurnConfig(enable=True)))
    assert sorted(problems(c)) == sorted([("algorithm.ref_update_every", "error"),   # LoRA: no frozen copy
                                          ("run.save_every", "error"),               # not a multiple of 4
                                          ("actor.policy_loss", "error")])           # its gradient needs seq sums
    # multi-turn rows have no reference answer to pair: the rollout table's check says so
    kind = check_rollout_kind(c, CheckContext(base_dir=Path("."), raw={}, machine=False))
    assert [(p.key, p.severity) for p in kind] == [("rollout.multi_turn.enable", "error")]


def test_refresh_needs_a_reference_and_sppo_needs_both_halves():
    assert problems(Config(algorithm=AlgorithmConfig(ref_update_every=2))) == [("algorithm.ref_update_every", "error")]
    assert problems(Config(algorithm=AlgorithmConfig(name="sppo"))) == [("actor.policy_loss", "error")]
    assert problems(Config(actor=ActorConfig(policy_loss="sppo"))) == [("actor.policy_loss", "error")]


def test_opponent_refresh_schedule_and_resume_points():
    assert [s for s in range(1, 10) if refresh_due(s, 3)] == [4, 7]
    assert not any(refresh_due(s, 0) for s in range(1, 10))
    for step in (0, 1, 2, 3, 6):   # before the first refresh, or at an iteration's end
        check_resume_step(step, 3)
    with pytest.raises(CheckpointError, match="inside a self-play iteration"):
        check_resume_step(4, 3)
