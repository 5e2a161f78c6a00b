"""The batch plan: one pure function that validate, the controller and the workers share."""

from __future__ import annotations

import dataclasses

from rlctl.config.plan import batch_plan
from rlctl.config.schema import Config


def config(**sections) -> Config:
    base = Config()
    return dataclasses.replace(base, **{name: dataclasses.replace(getattr(base, name), **values)
                                        for name, values in sections.items()})


def test_hand_computed_plan_per_role():
    c = config(data={"batch_size": 8}, rollout={"n": 4}, resources={"workers": 2},
               actor={"mini_batch_size": 2, "micro_batch_size": 2, "ppo_epochs": 3},
               critic={"mini_batch_size": 0, "micro_batch_size": 8})
    actor = batch_plan(c, "actor")
    assert (actor.prompts_per_mini_batch, actor.sequences_per_mini_batch) == (2, 8)   # 2 prompts x n 4
    assert (actor.mini_batches_per_step, actor.optimizer_steps_per_rollout) == (4, 12)  # 8 / 2, x 3 epochs
    assert (actor.sequences_per_worker, actor.micro_batches_per_optimizer_step) == (4, 2)  # 8 / 2 workers, / 2
    critic = batch_plan(c, "critic")      # mini_batch_size 0: the whole step is one mini-batch
    assert (critic.prompts_per_mini_batch, critic.sequences_per_mini_batch) == (8, 32)
    assert (critic.optimizer_steps_per_rollout, critic.sequences_per_worker) == (1, 16)
    assert critic.micro_batches_per_optimizer_step == 2


def test_one_optimizer_step_per_rollout_by_default():
    assert batch_plan(Config()).optimizer_steps_per_rollout == 1   # on-policy: old log-probs can be reused


def test_on_gpus_every_gpu_of_every_node_is_a_worker():
    from rlctl.validate.training import check_batches

    c = config(data={"batch_size": 8}, rollout={"n": 4}, resources={"nodes": 2, "gpus_per_node": 4, "workers": 1},
               actor={"micro_batch_size": 2})
    assert batch_plan(c, "actor").sequences_per_worker == 4   # 32 sequences over 2 x 4 GPUs
    assert check_batches(c)[0] == []
    uneven = dataclasses.replace(c, data=dataclasses.replace(c.data, batch_size=3),
                                 actor=dataclasses.replace(c.actor, mini_batch_size=3))
    problems = check_batches(uneven)[0]
    assert len(problems) == 1 and "over the 8 GPU workers (resources.nodes x gpus_per_node)" in problems[0].message
    auto = dataclasses.replace(c, resources=dataclasses.replace(c.resources, gpus_per_node="auto"))
    assert batch_plan(auto, "actor").sequences_per_worker == 32   # "auto" unresolved (--skip-machine): workers


def test_a_token_budget_replaces_the_row_count_of_micro_batches():
    from rlctl.config.plan import step_plan
    from rlctl.validate.training import check_batches

    c = config(data={"batch_size": 4, "max_prompt_length": 256, "max_response_length": 512}, rollout={"n": 3},
               actor={"micro_batch_size": 5, "micro_batch_max_tokens": 512})
    problems, plan = check_batches(c)
    assert dict(plan.rows())["micro-batches per optimizer step (per worker)"] == "by tokens, <= 512 each"
    assert [(p.key, p.severity) for p in problems] == [("actor.micro_batch_max_tokens", "warning")]  # < 768
    assert "a row that long runs alone" in problems[0].message   # and micro_batch_size 5 of 12 is not an error
    fixed = dataclasses.replace(c, actor=dataclasses.replace(c.actor, micro_batch_max_tokens=0))
    assert dict(step_plan(fixed).rows())["micro-batches per optimizer step (per worker)"] == 2
    assert [p.key for p in check_batches(fixed)[0]] == ["actor.micro_batch_size"]


def test_the_mini_batch_count_is_decided_in_one_place():
    """The controller (with_mini_batches) and a worker called without a count (mini_batch_count) both
    ask rlctl.config.plan.mini_batch_count: the plan's sequences per mini-batch each, fewer for a short
    batch, lowered until the rows split evenly over the workers; a rollout's own count is kept."""
    from types import SimpleNamespace

    import numpy as np

    from rlctl.config.plan import mini_batch_count
    from rlctl.controller.trainer import with_mini_batches
    from rlctl.runtime.batch import Batch
    from rlctl.workers.compute.training import mini_batch_count as worker_count

    assert mini_batch_count(32, world=2, sequences_per_mini=8) == 4       # 4 prompts x n 2 per step of 16 x 2
    assert mini_batch_count(24, world=2, sequences_per_mini=8) == 3       # a short (dynamic-sampling) batch
    assert mini_batch_count(20, world=4, sequences_per_mini=8) == 1       # 2 would leave 20 % 8 rows over
    assert mini_batch_count(30, world=2, sequences_per_mini=8, preset=4) == 3   # 30 % 8: lowered to 3
    c = config(data={"batch_size": 8}, rollout={"n": 2}, actor={"mini_batch_size": 2, "micro_batch_size": 1},
               resources={"workers": 2})
    for rows in (16, 12, 10):
        batch = Batch({"response_mask": np.ones((rows, 3), dtype=np.int64)})
        count = with_mini_batches(batch, "actor", c, SimpleNamespace(world_size=2)).meta["mini_batches"]
        shard = Batch({"response_mask": np.ones((rows // 2, 3), dtype=np.int64)})
        assert count == worker_count(shard, world=2, sequences_per_mini=4) == {16: 4, 12: 3, 10: 1}[rows]
