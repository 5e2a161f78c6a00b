"""The role table (rlctl.workers.roles.table): which roles a config starts, where, and the checkpoint
folders the trained ones own (their names are the layout every saved run folder has: resume of an
old run reads them)."""

from __future__ import annotations

import dataclasses

from rlctl.algorithms import algorithm_needs
from rlctl.config import schema
from rlctl.workers.roles.table import ACTOR, BESIDE_ACTOR, OWN_POOL, ROLES, RunRoles, pool_resources, role_folders


def _config(**sections) -> schema.Config:
    return dataclasses.replace(schema.Config(model=schema.ModelConfig(path="m")), **sections)


def _started(config: schema.Config, algorithm: str = "grpo") -> dict[str, dict]:
    needs = algorithm_needs(algorithm, kl_in_reward=False, use_kl_loss=config.actor.use_kl_loss)
    run = RunRoles(config, 7, needs)
    return {name: kwargs for role in ROLES for name, kwargs in role.instances(run).items()}


def test_the_trained_roles_own_the_folders_every_saved_run_has():
    assert role_folders() == ("actor/", "critic/", "prm/")
    assert [r.name for r in ROLES if r.placement == ACTOR] == ["actor"]
    assert {r.name: r.placement for r in ROLES if r.placement != ACTOR} == {
        "critic": BESIDE_ACTOR, "prm": BESIDE_ACTOR, "reward_model": BESIDE_ACTOR, "teacher": BESIDE_ACTOR,
        "rollout": OWN_POOL}


def test_a_config_starts_the_roles_its_algorithm_and_keys_ask_for():
    plain = _started(_config())
    assert list(plain) == ["actor"] and plain["actor"]["needs"].reference is False and plain["actor"]["total_steps"] == 7
    assert _started(_config(actor=schema.ActorConfig(use_kl_loss=True)))["actor"]["needs"].reference is True
    assert list(_started(_config(), "gae")) == ["actor", "critic"]
    assert list(_started(_config(), "prime")) == ["actor", "prm"]
    assert "reward_model" in _started(_config(reward=schema.RewardConfig(model="rm")))
    teachers = _started(_config(distill=schema.DistillConfig(teachers={"math": "a", "code": "b"})))
    assert {k: v["path"] for k, v in teachers.items() if k.startswith("teacher:")} == {"teacher:math": "a",
                                                                                       "teacher:code": "b"}
    off = _config(rollout=schema.RolloutConfig(mode="one_step_off"),
                  resources=schema.ResourcesConfig(gpus_per_node=0, workers=2, rollout_workers=1))
    assert "rollout" in _started(off) and "rollout" not in plain
    rollout_row = next(r for r in ROLES if r.name == "rollout")
    assert rollout_row.resources(off) == pool_resources(off)[1] and rollout_row.resources(off).workers == 1


def test_every_row_names_a_worker_class_that_imports():
    """A row names its class as "module:Class" (the table imports no torch): a module moved or a class
    renamed must fail here, not at a run's start."""
    for role in ROLES:
        cls = role.worker_class()
        assert isinstance(cls, type) and cls.__name__ == role.worker.rpartition(":")[2], role.name
        assert hasattr(cls, "save_checkpoint") == role.trained, role.name   # trained: the engine's three methods
