"""Where the groups of rollout.mode = "one_step_off" / "async" are placed (rlctl.workers.roles.table.
pool_resources -> rlctl.runtime.resource_pool.ResourcePool). No GPU on the test machine: the GPU
case checks only the resource specs the groups would be created with (gpus_per_node given as a
number, so nothing asks CUDA), not a run on GPUs."""

from __future__ import annotations

import dataclasses

import pytest

from rlctl.config.schema import Config
from rlctl.errors import ConfigError
from rlctl.runtime.resource_pool import ResourcePool
from rlctl.workers.roles.table import pool_resources


def config(mode: str, **resources) -> Config:
    c = Config()
    return dataclasses.replace(c, rollout=dataclasses.replace(c.rollout, mode=mode),
                               resources=dataclasses.replace(c.resources, **resources))


def pools(c: Config) -> tuple[ResourcePool, ResourcePool | None]:
    actor, rollout = pool_resources(c)
    return ResourcePool(actor, name="actor"), rollout and ResourcePool(rollout, name="rollout")


def test_on_gpus_the_rollout_ranks_get_one_gpu_each_and_the_actor_the_rest():
    actor, rollout = pools(config("async", gpus_per_node=4, rollout_workers=1, cpus_per_worker=2))
    assert (actor.world_size, actor.use_gpu, actor.bundles()) == (3, True, [{"CPU": 6.0, "GPU": 3.0}])
    assert (rollout.world_size, rollout.use_gpu, rollout.bundles()) == (1, True, [{"CPU": 2.0, "GPU": 1.0}])
    actor, rollout = pools(config("one_step_off", gpus_per_node=8, rollout_workers=3))
    assert (actor.world_size, rollout.world_size) == (5, 3)
    assert actor.bundles()[0]["GPU"] + rollout.bundles()[0]["GPU"] == 8   # every GPU of the node, none twice


def test_on_cpu_the_groups_split_cpu_workers_and_sync_has_no_rollout_group():
    actor, rollout = pools(config("async", gpus_per_node=0, workers=1, rollout_workers=2))
    assert (actor.world_size, rollout.world_size, actor.use_gpu, rollout.use_gpu) == (1, 2, False, False)
    assert rollout.bundles() == [{"CPU": 2.0}]
    assert pool_resources(config("sync", gpus_per_node=4))[1] is None


def test_gpu_splits_that_do_not_fit_one_node_are_refused():
    for resources in ({"gpus_per_node": 2, "rollout_workers": 2}, {"gpus_per_node": 4, "nodes": 2}):
        with pytest.raises(ConfigError):
            pool_resources(config("async", **resources))
