"""Actor and critic workers as a real Ray group over real gloo (CPU, FSDP2 with 2 ranks).

One module-scoped Ray session with one 2-rank group (actor + co-located critic); the 1-rank
baseline is the same worker class built in this process (one rank, a plain module, no Ray),
which keeps the module within the test-time budget of a 2-core machine.
"""

from __future__ import annotations

import numpy as np
import pytest
from worker_fixtures import needs, ragged_batch, run_config

from rlctl.runtime import Batch

ray = pytest.importorskip("ray")

from rlctl.runtime.ray_env import ray_session  # noqa: E402
from rlctl.workers.roles.groups import start_workers  # noqa: E402

pytestmark = pytest.mark.slow   # starts Ray, trains a run or starts a subprocess

T = 5


@pytest.fixture(scope="module")
def cfg(tiny_model_dir):
    return run_config(tiny_model_dir,
                      actor={"lr": 1e-2, "micro_batch_size": 2, "entropy_coef": 0.01, "use_kl_loss": True,
                             "kl_loss_coef": 0.1, "warmup_steps": 2},
                      critic={"lr": 1e-2, "micro_batch_size": 2},
                      rollout={"n": 2}, data={"batch_size": 4, "max_response_length": T},
                      algorithm={"name": "gae"})


@pytest.fixture(scope="module")
def groups(cfg):
    """(one rank in this process: actor, two Ray ranks: actor + co-located critic)."""
    import dataclasses

    import torch

    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    with ray_session(num_cpus=2):
        two_cfg = dataclasses.replace(cfg, resources=dataclasses.replace(cfg.resources, workers=2))
        two = start_workers(two_cfg, total_steps=4, needs=needs(reference=True, critic=True))
        torch.set_num_threads(1)
        yield ActorRolloutRefWorker(cfg, total_steps=4, needs=needs(reference=True)), two


def _train_batch(one):
    batch = Batch(ragged_batch(rows=8, response_width=T, seed=3))
    batch = batch.union(one.compute_log_prob(batch))
    return batch.union(one.compute_ref_log_prob(batch))


def _weights(actor, path, cfg):
    """The actor's weights as `rlctl merge` reads them: saved, then loaded in one process without Ray."""
    from rlctl.checkpoint.trained import load_trained_model

    actor.save_checkpoint(str(path / "actor"))
    return {k: v.numpy() for k, v in load_trained_model(path, cfg).state_dict().items()}


def test_two_ranks_train_like_one(groups, tmp_path):
    one, two = groups
    batch = _train_batch(one)
    old_two = two.actor.compute_log_prob(batch)
    np.testing.assert_allclose(old_two["old_log_prob"], batch["old_log_prob"], atol=1e-6)
    # 5 rows: ranks run 2 and 1 micro-batches; whole-weight inference cannot deadlock on that
    uneven = two.actor.compute_log_prob(batch.slice(0, 5))
    np.testing.assert_allclose(uneven["old_log_prob"], batch["old_log_prob"][:5], atol=1e-6)
    batch.meta["mini_batches"] = 2            # two optimizer steps per update, striped over ranks
    for step in range(2):
        m1, m2 = one.update_actor(batch), two.actor.update_actor(batch)
        assert m1["actor/optimizer_steps"] == m2["actor/optimizer_steps"] == 2
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/kl", "actor/entropy", "actor/grad_norm", "actor/lr"):
            assert m1[key] == pytest.approx(m2[key], abs=1e-5, rel=1e-5), (step, key)
    w1, w2 = _weights(one, tmp_path / "one", one.cfg), _weights(two.actor, tmp_path / "two", one.cfg)
    assert sorted(w1) == sorted(w2)
    for key in w1:
        np.testing.assert_allclose(w1[key], w2[key], atol=2e-5, err_msg=key)


def test_checkpoint_restores_exactly_and_continues_identically(groups, tmp_path):
    _, two = groups
    batch = _train_batch(groups[0])
    two.actor.update_actor(batch)
    cfg = groups[0].cfg
    two.actor.save_checkpoint(str(tmp_path / "ckpt"))
    saved = _weights(two.actor, tmp_path / "saved", cfg)
    first = two.actor.update_actor(batch)
    after_first = _weights(two.actor, tmp_path / "first", cfg)
    info = two.actor.load_checkpoint(str(tmp_path / "ckpt"))          # rewind the same group
    assert info["world_size"] == 2 and info["optimizer_state"]
    restored = _weights(two.actor, tmp_path / "restored", cfg)
    assert all(np.array_equal(saved[k], restored[k]) for k in saved)   # bitwise
    again = two.actor.update_actor(batch)
    assert again == first                                              # same metrics, exactly
    replay = _weights(two.actor, tmp_path / "again", cfg)
    assert all(np.array_equal(after_first[k], replay[k]) for k in after_first)
    files = sorted(p.name for p in (tmp_path / "ckpt" / "model").iterdir())
    assert len(files) == 2 and all(f.endswith(".safetensors") for f in files)  # one shard per rank

    one = groups[0]
    one.load_checkpoint(str(tmp_path / "ckpt"))                        # 2 ranks -> 1 rank (resharded)
    resharded = _weights(one, tmp_path / "one_rank", cfg)
    assert all(np.array_equal(saved[k], resharded[k]) for k in saved)


def test_colocated_critic_values_and_update(groups):
    _, two = groups
    assert two.critic.group is two.actor.group                         # same ranks, same processes
    batch = Batch(ragged_batch(rows=8, response_width=T, seed=4))
    values = two.critic.compute_values(batch)["values"]
    assert values.shape == (8, T) and (values[batch["response_mask"] == 0] == 0).all()
    batch["values"], batch["returns"] = values, values + 1.0
    metrics = two.critic.update_critic(batch)
    assert np.isfinite(metrics["critic/vf_loss"]) and metrics["critic/optimizer_steps"] == 1
    moved = two.critic.compute_values(batch)["values"]
    assert (moved - values)[batch["response_mask"] != 0].mean() > 0     # towards the returns


def test_generate_n_samples_per_prompt_in_order(groups):
    _, two = groups
    ids = np.array([[259, 259, 72, 105], [259, 10, 20, 30], [1, 2, 3, 4]])   # left-padded prompts
    prompts = Batch({"input_ids": ids, "attention_mask": (ids != 259).astype(np.int64),
                     "uid": np.array(["a", "b", "c"], dtype=object)})
    out = two.actor.generate(prompts, seed=7)
    assert len(out) == 6 and list(out["uid"]) == ["a", "a", "b", "b", "c", "c"]
    width = groups[0].cfg.data.max_prompt_length               # prompts left-padded to a fixed P
    assert out["responses"].shape == (6, T) and out["input_ids"].shape == (6, width + T)
    assert (out["response_mask"].sum(1) == out["response_length"]).all()
    assert np.array_equal(out["prompts"][:, -4:], np.repeat(prompts["input_ids"], 2, axis=0))
    assert (out["attention_mask"][:, :width - 4] == 0).all()
    log_prob = two.actor.compute_log_prob(out)["old_log_prob"]
    assert log_prob.shape == (6, T) and ((log_prob != 0) == (out["response_mask"] != 0)).all()
    again = two.actor.generate(prompts, seed=7)
    assert np.array_equal(out["responses"], again["responses"])           # seeded per (seed, rank)
