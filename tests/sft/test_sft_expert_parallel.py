"""One SFT step of a tiny Qwen3-MoE (4 experts, top-2) on two real gloo ranks with the experts split
(actor.expert_parallel_size = 2) equals the step with every expert on both ranks (ep = 1): the same
train/loss, load-balancing loss, gradient norm and validation NLL, and the same weights after the
step. The load-balancing term (weighted 0.5 here, so that it shows through Adam's first step, which
is nearly lr * sign(g)) is really in the loss: with actor.moe_aux_loss_coef = 0 the router ends
the step elsewhere.

Tolerances: metrics rtol 1e-5, weights 1e-5 absolute (= 1/1000 of the lr 1e-2 step: Adam's first
step is lr * g / (|g| + eps), so float32 rounding of the two summation orders of a tiny gradient
element shows in the weights; measured 1.8e-6)."""

from __future__ import annotations

import dataclasses
import datetime
import os

import numpy as np
import pytest
import torch
from support.gloo_ranks import run_ranks

WORLD = 2
ROUTER = "model.layers.0.mlp.gate.weight"
BANK = "model.layers.1.mlp.experts.gate_up_proj"


def _config(model_dir, ep: int, coef: float):
    from rlctl.config.schema import Config

    c = Config()
    return dataclasses.replace(
        c, model=dataclasses.replace(c.model, path=str(model_dir), dtype="float32"),
        actor=dataclasses.replace(c.actor, lr=1e-2, micro_batch_size=2, weight_decay=0.0, warmup_steps=0,
                                  expert_parallel_size=ep, moe_aux_loss_coef=coef),
        run=dataclasses.replace(c.run, kind="sft"))


def _shard(rank: int):
    """This rank's 3 right-padded rows (real lengths differ: ranks cut 2 micro-batches of
    different widths) whose first tokens are a prompt without loss."""
    from rlctl.runtime.batch import Batch

    rng = np.random.default_rng(10 + rank)
    lengths, prompts, width = [9, 5 + rank, 12], [3, 2, 5], 12
    ids = rng.integers(3, 200, size=(3, width))
    cols = np.arange(width)[None]
    real = cols < np.asarray(lengths)[:, None]
    loss = real & (cols >= np.asarray(prompts)[:, None])
    return Batch({"input_ids": np.where(real, ids, 0).astype(np.int64), "attention_mask": real.astype(np.int64),
                  "loss_mask": loss.astype(np.float32)})


def _rank_main(rank, model_dir, init_file, out_dir, ep, coef):
    import torch.distributed as dist

    from rlctl.workers.parallel import fsdp
    from rlctl.workers.roles.sft import SFTWorker
    from rlctl.workers.rollout.weights import engine_weights

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    worker = SFTWorker(_config(model_dir, ep, coef), total_steps=1)
    batch = _shard(rank)
    assert len(worker._micro_batches(batch)) == 2
    metrics = worker.train_step(batch)
    nll = worker.eval_nll(batch)["nll_sum"]
    with fsdp.whole_weights(worker.actor.module):
        weights = {k: v.clone().numpy() for k, v in engine_weights(worker.actor.module)}
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), nll=nll, **{f"metric/{k}": v for k, v in metrics.items()},
             **({f"w/{k}": v for k, v in weights.items()} if rank == 0 else {}))
    dist.destroy_process_group()


def _run(model_dir, tmp_path, ep: int, coef: float = 0.5) -> list[dict]:
    out = tmp_path / f"ep{ep}_coef{coef}"
    out.mkdir()
    run_ranks(_rank_main, (str(model_dir), str(out / "pg"), str(out), ep, coef), WORLD)
    return [dict(np.load(out / f"rank{r}.npz")) for r in range(WORLD)]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_an_sft_step_at_ep2_equals_ep1_with_the_load_balancing_loss(tiny_moe_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    ep2, ep1 = _run(tiny_moe_dir, tmp_path, 2), _run(tiny_moe_dir, tmp_path, 1)
    for a, b in zip(ep2, ep1):
        assert sorted(a) == sorted(b)
        np.testing.assert_allclose(a["nll"], b["nll"], rtol=1e-5)
        for key in (k for k in a if k.startswith("metric/")):
            np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-7, err_msg=key)
    assert ep2[0]["metric/actor/moe_aux_loss"] >= 2 - 1e-3   # top-2: 2 when balanced, a real value
    weights = [k for k in ep2[0] if k.startswith("w/")]
    assert ep2[0][f"w/{BANK}"].shape[0] == 4   # every expert, gathered
    worst = max(float(np.abs(ep2[0][k] - ep1[0][k]).max()) for k in weights)
    print("SFT step ep=2 vs ep=1, largest |weight difference|:", worst)
    assert worst < 1e-5, worst
    initial = dict(AutoModelForCausalLM.from_pretrained(tiny_moe_dir, dtype=torch.float32).named_parameters())
    assert np.abs(ep2[0][f"w/{BANK}"] - initial[BANK].detach().numpy()).max() > 1e-3   # the experts trained

    off = _run(tiny_moe_dir, tmp_path, 2, coef=0.0)   # the same step without the load-balancing term
    assert "metric/actor/moe_aux_loss" not in off[0]
    assert off[0]["metric/train/loss"] == pytest.approx(ep2[0]["metric/train/loss"], rel=1e-6)   # NLL alone
    assert np.abs(off[0][f"w/{ROUTER}"] - ep2[0][f"w/{ROUTER}"]).max() > 1e-6   # the term moved the router
