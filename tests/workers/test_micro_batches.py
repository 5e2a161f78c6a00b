"""Token-budget micro-batches (actor/critic.micro_batch_max_tokens) against fixed-row ones.

The workers run here in-process (one rank, no Ray): the same code a worker group runs. The update's
gradients are read at the optimizer step (before Adam), so "equal" means the loss and every
gradient, not only weights after a step that Adam's normalisation would blur.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from worker_fixtures import needs, ragged_batch, run_config

from rlctl.runtime import Batch
from rlctl.workers.compute.micro_batches import plan_micro_batches

T = 12
BUDGET = 40   # tokens: rows here hold 2-18 real tokens, so 2-8 rows a micro-batch


def test_packed_plans_keep_row_order_and_stay_within_the_budget():
    lengths = np.array([5, 50, 7, 300, 12, 12, 40, 9])
    groups = plan_micro_batches(lengths, max_tokens=100, max_rows=99, padded=False)
    assert groups == [[0, 1, 2], [3], [4, 5, 6, 7]]   # in order: 62 | 300 alone | 73
    assert all(len(g) == 1 or lengths[g].sum() <= 100 for g in groups)
    forced = plan_micro_batches(lengths, max_tokens=100, max_rows=99, count=6, padded=False)
    assert len(forced) == 6 and sorted(i for g in forced for i in g) == list(range(8))
    assert [len(g) for g in plan_micro_batches(lengths, max_tokens=0, max_rows=3, padded=False)] == [3, 3, 2]


def _batch(rows: int = 12, seed: int = 5) -> Batch:
    """Prompts of 1-6 tokens and responses of 1-12, advantages and fixed old log-probs."""
    b = ragged_batch(rows=rows, response_width=T, seed=seed)
    rng = np.random.default_rng(seed)
    b["old_log_prob"] = (rng.normal(size=(rows, T)) * 0.1 - 3.0).astype(np.float32)
    b["ref_log_prob"] = (rng.normal(size=(rows, T)) * 0.1 - 3.0).astype(np.float32)
    return Batch(b)


def _grads_at_step(engine) -> list:
    """Every parameter's gradient as each optimizer step of `engine` sees it (a step pre-hook)."""
    seen = []
    engine.optimizer.register_step_pre_hook(lambda *_: seen.append([p.grad.detach().clone() for p in engine.params]))
    return seen


def _cfg(tiny_model_dir, budget: int, **actor):
    cfg = run_config(tiny_model_dir, actor={"lr": 1e-3, "micro_batch_size": 2, "use_kl_loss": True,
                                            "kl_loss_coef": 0.1, "entropy_coef": 0.01, **actor},
                     critic={"lr": 1e-3, "micro_batch_size": 2},
                     data={"batch_size": 6, "max_response_length": T}, rollout={"n": 2})
    return dataclasses.replace(cfg, actor=dataclasses.replace(cfg.actor, micro_batch_max_tokens=budget),
                               critic=dataclasses.replace(cfg.critic, micro_batch_max_tokens=budget))


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-sum"])
def test_actor_token_budget_equals_fixed_rows(tiny_model_dir, monkeypatch, loss_agg_mode):
    from rlctl.workers.compute import logprob, training
    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    torch.set_num_threads(1)
    plans = []   # what the passes planned, one entry per call of the planner
    for module, name in ((logprob, "plan_micro_batches"), (training, "synced_plan")):
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, real=real, **k: plans.append(real(*a, **k)) or plans[-1])
    fixed, budget = (ActorRolloutRefWorker(_cfg(tiny_model_dir, b, loss_agg_mode=loss_agg_mode), total_steps=2,
                                           needs=needs(reference=True)) for b in (0, BUDGET))
    batch = _batch()
    batch.meta["mini_batches"] = 2                      # two optimizer steps of 6 rows each
    a, b = fixed.compute_log_prob(batch), budget.compute_log_prob(batch)
    np.testing.assert_allclose(b["old_log_prob"], a["old_log_prob"], atol=1e-6)
    np.testing.assert_allclose(b["entropy"], a["entropy"], atol=1e-5)
    np.testing.assert_allclose(budget.compute_ref_log_prob(batch)["ref_log_prob"],
                               fixed.compute_ref_log_prob(batch)["ref_log_prob"], atol=1e-6)
    assert plans and all(len(g) > 1 for g in plans[-1][:-1])   # the budget grouped rows, not one each
    plans.clear()
    grads_a, grads_b = _grads_at_step(fixed.actor), _grads_at_step(budget.actor)
    ma, mb = fixed.update_actor(batch), budget.update_actor(batch)
    tokens = batch["attention_mask"].sum(1)
    counts = [len(p) for p in plans]
    assert len(plans) == 2 and counts != [3, 3]          # cut by tokens, not 2 rows at a time
    assert all(len(g) == 1 or tokens[6 * k:][g].sum() <= BUDGET for k, p in enumerate(plans) for g in p)
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
        assert mb[key] == pytest.approx(ma[key], rel=1e-5, abs=1e-7), key
    assert len(grads_a) == len(grads_b) == 2
    for step_a, step_b in zip(grads_a, grads_b):
        for ga, gb in zip(step_a, step_b):
            torch.testing.assert_close(gb, ga, rtol=1e-4, atol=1e-7)


def test_critic_token_budget_equals_fixed_rows(tiny_model_dir):
    from rlctl.workers.roles.critic import CriticWorker

    torch.set_num_threads(1)
    fixed, budget = (CriticWorker(_cfg(tiny_model_dir, b), total_steps=2) for b in (0, BUDGET))
    batch = _batch(seed=6)
    values = fixed.compute_values(batch)["values"]
    np.testing.assert_allclose(budget.compute_values(batch)["values"], values, atol=1e-6)
    batch["values"], batch["returns"] = values, values + 1.0
    grads_a, grads_b = _grads_at_step(fixed.critic), _grads_at_step(budget.critic)
    ma, mb = fixed.update_critic(batch), budget.update_critic(batch)
    assert mb["critic/vf_loss"] == pytest.approx(ma["critic/vf_loss"], rel=1e-5)
    for ga, gb in zip(grads_a[0], grads_b[0]):
        torch.testing.assert_close(gb, ga, rtol=1e-4, atol=1e-7)


def _two_rank_main(rank: int, init_file: str, model_dir: str, out_dir: str) -> None:
    """Rank `rank` of 2 (gloo, FSDP2): log-probs and two updates of the token-balanced split, then an
    update whose split gives rank 0 the long rows (its plan has more micro-batches: the ranks must
    still run as many, or FSDP's collectives hang)."""
    import datetime

    import torch.distributed as dist

    from rlctl.runtime import Dispatch
    from rlctl.runtime.balance import balance_rows, balanced, restore_order
    from rlctl.runtime.dispatch import collect_results, split_arguments
    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=120))
    worker = ActorRolloutRefWorker(_cfg(model_dir, BUDGET), total_steps=2, needs=needs(reference=True))
    batch = _long_first_batch()

    def parts(mode, flagged):
        args, _, inverse = balance_rows(mode, 2, (flagged,), {})
        return [a[0] for a, _ in split_arguments(mode, 2, args, {}, "actor.m")], inverse

    shards, inverse = parts(Dispatch.DP, balanced(batch, BUDGET))
    mine = worker.compute_log_prob(shards[rank])["old_log_prob"]
    gathered = [None, None]
    dist.all_gather_object(gathered, mine)
    old = restore_order(collect_results(Dispatch.DP, [Batch({"x": g}) for g in gathered]), inverse)["x"]
    metrics = [worker.update_actor(parts(Dispatch.DP_TRAIN, balanced(batch, BUDGET))[0][rank]),
               worker.update_actor(parts(Dispatch.DP_TRAIN, batch)[0][rank])]   # unbalanced: rank 0 long rows
    if rank == 0:
        keys = ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm")
        out = {"old": old.tolist(), "metrics": [{k: m[k] for k in keys} for m in metrics]}
        Path(out_dir, "rank0.json").write_text(json.dumps(out))
    dist.destroy_process_group()


def _long_first_batch() -> Batch:
    """12 rows, 2 mini-batches: the first half of each (rank 0's part in a plain split) the longest rows."""
    b = _batch(seed=7)
    tokens = b["attention_mask"].sum(1)
    order = np.concatenate([block[np.argsort(-tokens[block], kind="stable")]
                            for block in (np.arange(6), np.arange(6, 12))])
    b = b.select(order)
    b.meta["mini_batches"] = 2
    return b


@pytest.mark.slow   # starts two rank processes
@pytest.mark.timeout(300)
def test_two_ranks_with_a_token_budget_train_like_one_rank_with_fixed_rows(tiny_model_dir, tmp_path):
    from support.gloo_ranks import run_ranks

    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    batch = _long_first_batch()
    tokens = batch["attention_mask"].sum(1)   # the plain split's rank parts of mini-batch 1: rows 0-2 and 3-5
    local = [len(plan_micro_batches(tokens[rows], max_tokens=BUDGET, max_rows=2, padded=False))
             for rows in (np.arange(3), np.arange(3, 6))]
    assert local[0] > local[1]                # so the second update needs the ranks' counts evened out
    run_ranks(_two_rank_main, (str(tmp_path / "pg"), str(tiny_model_dir), str(tmp_path)), 2)
    got = json.loads((tmp_path / "rank0.json").read_text())
    torch.set_num_threads(1)
    one = ActorRolloutRefWorker(_cfg(tiny_model_dir, 0), total_steps=2, needs=needs(reference=True))
    np.testing.assert_allclose(got["old"], one.compute_log_prob(batch)["old_log_prob"], atol=1e-6)
    for two in got["metrics"]:
        metrics = one.update_actor(batch)
        for key, value in two.items():
            assert value == pytest.approx(metrics[key], rel=1e-4, abs=1e-6), (key, value, metrics[key])
