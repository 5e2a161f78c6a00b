"""Expert parallelism with the engine's other options, on two real gloo ranks and a tiny Qwen3-MoE
(4 experts, top-2, 2 layers):

- gradient checkpointing (model.gradient_checkpointing) at ep = 2: backward reruns each layer's
  forward, both all-to-alls included, on every rank in the same layer order; the loss, aux loss and
  every gradient equal those without checkpointing (float32 rounding), and the dispatch is seen to
  run twice per layer, so the recompute really crossed the exchange;
- the reference refresh (algorithm.ref_update_every: ActorRolloutRefWorker.sync_reference) with an
  ep = 2 policy and an unsplit reference: after a policy step the reference holds every expert of
  the policy, and its log-probs are the policy's.
"""

from __future__ import annotations

import dataclasses
import datetime
import os

import numpy as np
import pytest
import torch
from support.gloo_ranks import run_ranks

WORLD, ROWS, WIDTH = 2, 4, 12
BANK = "model.layers.0.mlp.experts.gate_up_proj"


def _init(rank, init_file):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))


def _rows(rank: int) -> torch.Tensor:
    rows = torch.randint(3, 200, (ROWS, WIDTH), generator=torch.Generator().manual_seed(7))
    return rows[rank * ROWS // WORLD:(rank + 1) * ROWS // WORLD]


def _count_dispatches() -> list:
    """Count the expert exchanges (rlctl.workers.parallel.expert_parallel.dispatch calls) from now on."""
    from rlctl.workers.parallel import expert_parallel

    calls, original = [], expert_parallel.dispatch

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    expert_parallel.dispatch = counted
    return calls


def _ckpt_main(rank, model_dir, init_file, out_dir, checkpointing):
    """The engine at ep = 2 (with or without checkpointing): token-mean CE over the global batch plus
    the router's aux loss, backward, expert grads reduced; rank 0 saves loss and whole gradients."""
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from rlctl.workers.compute.engine import OptimSpec, TrainEngine
    from rlctl.workers.parallel import expert_parallel, fsdp

    _init(rank, init_file)
    spec = OptimSpec(lr=1e-2, weight_decay=0.0, grad_clip=0.0, warmup_steps=0, total_steps=1)
    engine = TrainEngine(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), spec,
                         compute_dtype=torch.float32, gradient_checkpointing=checkpointing, expert_parallel_size=2)
    assert engine.module.training and engine.module.is_gradient_checkpointing == checkpointing
    calls = _count_dispatches()
    rows = _rows(rank)
    out = engine.module(input_ids=rows, output_router_logits=True, use_cache=False)
    logits = out.logits[:, :-1].float()
    ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1),
                                           reduction="sum") / (ROWS * (WIDTH - 1)) * WORLD
    (ce + 0.5 * out.aux_loss).backward()
    expert_parallel.reduce_expert_grads(engine.expert_params, engine.expert_groups)
    grads = {}
    for name, p in engine.module.named_parameters():
        if any(p is e for e in engine.expert_params):   # this rank's experts: all of them, gathered
            pieces = [torch.empty_like(p.grad) for _ in range(2)]
            dist.all_gather(pieces, p.grad, group=engine.expert_groups.ep_group)
            grads[name] = torch.cat(pieces)
        else:
            grads[name] = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
    ce_sum, aux = fsdp.all_reduce_sum([float(ce.detach()) / WORLD, float(out.aux_loss.detach()) / WORLD])
    if rank == 0:
        np.savez(os.path.join(out_dir, "result.npz"), ce=ce_sum, aux=aux, dispatches=len(calls),
                 **{f"grad/{k}": v.detach().numpy() for k, v in grads.items()})
    dist.destroy_process_group()


def _run(fn, tmp_path, name, model_dir, *more) -> list[dict]:
    """fn(rank, model_dir, init_file, out_dir, *more) on WORLD ranks; the .npz files they saved."""
    out = tmp_path / name
    out.mkdir()
    run_ranks(fn, (str(model_dir), str(out / "pg"), str(out), *more), WORLD)
    return [dict(np.load(f)) for f in sorted(out.glob("*.npz"))]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_gradient_checkpointing_at_ep2_recomputes_the_exchange_and_gives_the_same_gradients(tiny_moe_dir, tmp_path):
    [ckpt] = _run(_ckpt_main, tmp_path, "ckpt", tiny_moe_dir, True)
    [plain] = _run(_ckpt_main, tmp_path, "plain", tiny_moe_dir, False)
    assert int(plain["dispatches"]) == 2 and int(ckpt["dispatches"]) == 4   # 2 layers; + the recompute
    assert ckpt[f"grad/{BANK}"].shape[0] == 4 and np.abs(ckpt[f"grad/{BANK}"]).max() > 0
    assert sorted(ckpt) == sorted(plain)
    diffs = {k: float(np.abs(ckpt[k] - plain[k]).max()) for k in ckpt if k != "dispatches"}
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] < 1e-6, (worst, diffs[worst])
    assert float(ckpt["aux"]) > 1.0   # k = 2 when balanced: a real term


def _ref_main(rank, model_dir, init_file, out_dir):
    """An ep = 2 policy with an unsplit reference (ActorRolloutRefWorker): one policy step, then
    sync_reference; saves both models' whole weights and log-probs on this rank's rows."""
    import torch.distributed as dist

    from rlctl.algorithms import run_needs
    from rlctl.config.schema import Config
    from rlctl.runtime.batch import Batch
    from rlctl.workers.parallel import fsdp
    from rlctl.workers.roles.actor import ActorRolloutRefWorker
    from rlctl.workers.rollout.weights import engine_weights

    _init(rank, init_file)
    c = Config()
    config = dataclasses.replace(c, model=dataclasses.replace(c.model, path=model_dir, dtype="float32"),
                                 actor=dataclasses.replace(c.actor, lr=1e-2, expert_parallel_size=2))
    worker = ActorRolloutRefWorker(config, total_steps=1, needs=dataclasses.replace(run_needs(config), reference=True))
    rows = _rows(rank)

    def loss_fn(micro):
        logits = worker.actor.module(input_ids=micro["rows"], use_cache=False).logits[:, :-1].float()
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 micro["rows"][:, 1:].reshape(-1)), {}

    worker.actor.train_mini_batch([{"rows": rows}], loss_fn)

    def whole(engine):
        with fsdp.whole_weights(engine.module):
            return {k: v.detach().clone().float().numpy() for k, v in engine_weights(engine.module)}

    before = whole(worker.ref)
    worker.sync_reference()
    mask = np.ones((len(rows), WIDTH), np.int64)
    batch = Batch({"input_ids": rows.numpy(), "attention_mask": mask, "response_mask": mask[:, WIDTH // 2:]})
    policy_lp = worker.compute_log_prob(batch)["old_log_prob"]
    ref_lp = worker.compute_ref_log_prob(batch)["ref_log_prob"]
    policy, ref = whole(worker.actor), whole(worker.ref)
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), policy_lp=policy_lp, ref_lp=ref_lp,
             **{f"policy/{k}": v for k, v in policy.items()}, **{f"ref/{k}": v for k, v in ref.items()},
             **{f"before/{k}": v for k, v in before.items()})
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sync_reference_copies_every_expert_of_an_ep2_policy(tiny_moe_dir, tmp_path):
    ranks = _run(_ref_main, tmp_path, "ref", tiny_moe_dir)
    for got in ranks:
        names = [k.removeprefix("policy/") for k in got if k.startswith("policy/")]
        assert got[f"policy/{BANK}"].shape[0] == got[f"ref/{BANK}"].shape[0] == 4
        assert np.abs(got[f"before/{BANK}"] - got[f"policy/{BANK}"]).max() > 1e-3   # the step moved the experts
        for name in names:
            assert np.array_equal(got[f"ref/{name}"], got[f"policy/{name}"]), name
        np.testing.assert_allclose(got["ref_lp"], got["policy_lp"], atol=1e-6)
