"""actor.ulysses_sequence_parallel_size = 2 in a real 2-rank Ray group (FSDP2 over both ranks, one
sp group of 2 over gloo) against one rank without sequence parallelism, on the tiny Qwen2 (4 heads,
2 KV heads): old and reference log-probs, two GRPO updates (two optimizer steps each, KL loss,
entropy bonus) and the weights after them; then a checkpoint written at sp = 2 continues at sp = 1.
The critic at critic.ulysses_sequence_parallel_size = 2: its values and a value update likewise.

Tolerances: log-probs 1e-6 and the first update's metrics 1e-5 (float32 summation order: the sp
ranks run attention on all tokens but half the heads, and FSDP sums gradients over two ranks);
after Adam steps at lr 1e-2, which magnify that rounding where a gradient is near 0 (its sign
may flip, and Adam's step is lr x sign there), metrics 1e-4 relative and each weight tensor's
difference under 1e-3 of the distance the four optimizer steps moved it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from worker_fixtures import needs, ragged_batch, run_config

from rlctl.runtime import Batch

ray = pytest.importorskip("ray")

from rlctl.runtime.ray_env import ray_session  # noqa: E402
from rlctl.workers.roles.groups import start_workers  # noqa: E402

T = 5
ACTOR = {"lr": 1e-2, "micro_batch_size": 2, "entropy_coef": 0.01, "use_kl_loss": True, "kl_loss_coef": 0.1}


def _weights(actor, path, cfg):
    from rlctl.checkpoint.trained import load_trained_model

    actor.save_checkpoint(str(path / "actor"))
    return {k: v.numpy() for k, v in load_trained_model(path, cfg).state_dict().items()}


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sp2_grpo_step_equals_one_rank_and_its_checkpoint_continues_at_sp1(tiny_model_dir, tmp_path):
    import torch

    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    cfg = run_config(tiny_model_dir, actor=ACTOR, rollout={"n": 2}, data={"batch_size": 4, "max_response_length": T},
                     algorithm={"name": "grpo"})
    sp_cfg = dataclasses.replace(cfg, resources=dataclasses.replace(cfg.resources, workers=2),
                                 actor=dataclasses.replace(cfg.actor, ulysses_sequence_parallel_size=2),
                                 critic=dataclasses.replace(cfg.critic, ulysses_sequence_parallel_size=2, lr=1e-2))
    with ray_session(num_cpus=2):
        workers = start_workers(sp_cfg, total_steps=4, needs=needs(reference=True, critic=True))
        two = workers.actor
        torch.set_num_threads(1)
        _critic_equals_one_rank(workers.critic, dataclasses.replace(cfg, critic=sp_cfg.critic))
        one = ActorRolloutRefWorker(cfg, total_steps=4, needs=needs(reference=True))
        batch = Batch(ragged_batch(rows=8, response_width=T, seed=3))
        batch = batch.union(one.compute_log_prob(batch))
        batch = batch.union(one.compute_ref_log_prob(batch))
        two_old, two_ref = two.compute_log_prob(batch), two.compute_ref_log_prob(batch)
        np.testing.assert_allclose(two_old["old_log_prob"], batch["old_log_prob"], atol=1e-6)
        np.testing.assert_allclose(two_old["entropy"], batch["entropy"], atol=1e-6)
        np.testing.assert_allclose(two_ref["ref_log_prob"], batch["ref_log_prob"], atol=1e-6)
        uneven = two.compute_log_prob(batch.slice(0, 5))   # ranks' own shards of 3 and 2 rows
        np.testing.assert_allclose(uneven["old_log_prob"], batch["old_log_prob"][:5], atol=1e-6)
        w0 = _weights(one, tmp_path / "init", cfg)
        batch.meta["mini_batches"] = 2
        for step in range(2):
            m1, m2 = one.update_actor(batch), two.update_actor(batch)
            assert m1["actor/optimizer_steps"] == m2["actor/optimizer_steps"] == 2
            for key in ("actor/pg_loss", "actor/kl_loss", "actor/kl", "actor/entropy", "actor/grad_norm", "actor/lr"):
                tol = 1e-5 if step == 0 else 1e-4
                assert m1[key] == pytest.approx(m2[key], abs=tol, rel=tol), (step, key, m1[key], m2[key])
        w1, w2 = _weights(one, tmp_path / "one", cfg), _weights(two, tmp_path / "two", cfg)
        for key in w1:   # the two runs' difference against the distance the updates moved the weights
            moved = np.linalg.norm(w1[key] - w0[key])
            assert moved > 0 and np.linalg.norm(w1[key] - w2[key]) < 1e-3 * moved, key

        two.save_checkpoint(str(tmp_path / "ckpt"))          # written at sp = 2 ...
        one.load_checkpoint(str(tmp_path / "ckpt"))          # ... continued at sp = 1 (one rank)
        m1, m2 = one.update_actor(batch), two.update_actor(batch)
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/lr"):
            assert m1[key] == pytest.approx(m2[key], abs=1e-4, rel=1e-4), ("resumed", key)


def _critic_equals_one_rank(two, cfg):
    """critic.ulysses_sequence_parallel_size = 2: values and a value update as one rank's critic."""
    import dataclasses

    from rlctl.workers.roles.critic import CriticWorker

    one = CriticWorker(dataclasses.replace(cfg, critic=dataclasses.replace(cfg.critic, ulysses_sequence_parallel_size=1)),
                       total_steps=4)
    batch = Batch(ragged_batch(rows=8, response_width=T, seed=4))
    values = one.compute_values(batch)["values"]
    np.testing.assert_allclose(two.compute_values(batch)["values"], values, atol=1e-6)
    batch["values"], batch["returns"] = values, values + 1.0
    m1, m2 = one.update_critic(batch), two.update_critic(batch)
    for key in ("critic/vf_loss", "critic/grad_norm"):
        assert m1[key] == pytest.approx(m2[key], abs=1e-5, rel=1e-5), key
    np.testing.assert_allclose(two.compute_values(batch)["values"], one.compute_values(batch)["values"], atol=1e-4)
