"""Router replay (rlctl.workers.parallel.router_replay) in one process on a tiny Qwen3-MoE (4 experts, top-2,
2 MoE layers): replaying the routes the model itself chose gives bit for bit the loss, log-probs,
aux loss and every gradient of replay off; planted routes change exactly the planted tokens'
log-probs, the mismatch counts exactly the planted (token, layer) pairs, and the router keeps its
gradient; over two gloo ranks, planted routes replayed at ep = 2 give the log-probs, mismatch and
every gradient of ep = 1. The GRPO runs are in tests/controller/test_router_replay_run.py."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from rlctl.algorithms import LossNorm, aggregate_loss
from rlctl.errors import ConfigError
from rlctl.workers.compute.logprob import response_log_probs
from rlctl.workers.parallel import moe_aux, router_replay
from support.gloo_ranks import run_ranks

PROMPT, RESPONSE = 5, 6


def _model(path, replay: bool):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if replay:
        router_replay.install(model)
    return model


def _rows():
    """4 rows of a left-padded prompt and a right-padded response; rows 0-1 share their prompt
    (the shared layout then computes it once)."""
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(3, 200, (4, PROMPT + RESPONSE), generator=g)
    ids[1, :PROMPT] = ids[0, :PROMPT]
    mask = torch.ones_like(ids)
    mask[0:2, :1] = 0
    mask[1, PROMPT + 4:] = 0
    mask[2, :2] = 0
    mask[3, PROMPT + 2:] = 0
    return ids * mask, mask, mask[:, PROMPT:].float()


def _update(model, routes=None, pack=None, coef=0.5):
    """A token-mean -log pi plus coef x aux over the rows, backward: (out, loss, grads)."""
    ids, mask, response_mask = _rows()
    model.zero_grad(set_to_none=True)
    out = response_log_probs(model, ids, mask, RESPONSE, moe_aux=coef > 0, pack=pack, routes=routes)
    norm = LossNorm(tokens=float(response_mask.sum()), dp_size=1)
    loss = aggregate_loss(-out["log_prob"], response_mask, "token-mean", norm=norm)
    loss = moe_aux.add_aux_loss(loss, {}, out, response_mask, norm, coef)
    loss.backward()
    router_replay.clear(model)
    return out, loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}


def _recorded(model, pack=None) -> torch.Tensor:
    ids, mask, _ = _rows()
    with torch.no_grad():
        return response_log_probs(model, ids, mask, RESPONSE, pack=pack, routes=router_replay.RECORD)[router_replay.COLUMN]


@pytest.mark.parametrize("pack", [None, False, True], ids=["shared", "trim", "pack"])
def test_replaying_the_models_own_routes_is_bit_identical_to_replay_off(tiny_moe_dir, pack):
    off_out, off_loss, off_grads = _update(_model(tiny_moe_dir, False), pack=pack)
    model = _model(tiny_moe_dir, True)
    routes = _recorded(model, pack)
    _, _, response_mask = _rows()
    assert routes.shape == (4, RESPONSE, 2, 2) and routes.dtype == torch.uint8   # 4 experts: one byte each
    valid = response_mask.bool()
    assert bool((routes[~valid] == 0).all()) and routes[valid].unique().numel() > 2   # real ids, padding 0
    assert bool((routes[valid][..., 0] != routes[valid][..., 1]).all())              # k distinct experts
    out, loss, grads = _update(model, router_replay.Replay(routes, response_mask), pack=pack)
    assert torch.equal(out["log_prob"], off_out["log_prob"]) and torch.equal(loss, off_loss)
    assert torch.equal(out["moe_aux_loss"], off_out["moe_aux_loss"])
    assert grads.keys() == off_grads.keys()
    assert all(torch.equal(grads[k], off_grads[k]) for k in grads), [k for k in grads if not torch.equal(grads[k], off_grads[k])]
    assert float(out[router_replay.MISMATCH]) == 0 and float(out[router_replay.PAIRS]) == 2 * float(response_mask.sum())


def _plant(routes: torch.Tensor, where: list[tuple[int, int, int]]) -> torch.Tensor:
    """At each (row, token, layer) route to the two experts the router did not choose."""
    planted = routes.clone()
    for row, token, layer in where:
        others = [e for e in range(4) if e not in routes[row, token, layer].tolist()]
        planted[row, token, layer] = torch.tensor(others, dtype=routes.dtype)
    return planted


@pytest.mark.parametrize("pack", [None, False], ids=["shared", "trim"])
def test_planted_routes_change_exactly_their_tokens_and_the_mismatch_counts_them(tiny_moe_dir, pack):
    model = _model(tiny_moe_dir, True)
    routes = _recorded(model, pack)
    _, _, response_mask = _rows()
    own, _, own_grads = _update(model, router_replay.Replay(routes, response_mask), pack=pack, coef=0.0)
    # the last MoE layer: a token's route reaches only its own position's output (log pi of that token)
    last = [(0, 1, 1), (2, 3, 1), (3, 0, 1)]
    out, _, grads = _update(model, router_replay.Replay(_plant(routes, last), response_mask), pack=pack, coef=0.0)
    changed = (out["log_prob"] != own["log_prob"]).nonzero().tolist()
    assert sorted(changed) == sorted([row, token] for row, token, _ in last)
    assert float(out[router_replay.MISMATCH]) == len(last)
    gate = "model.layers.1.mlp.gate.weight"   # the router learns from the replayed experts' weights
    assert grads[gate].abs().max() > 0 and not torch.equal(grads[gate], own_grads[gate])
    # the first layer too; a real token outside response_mask (a tool's output) is replayed, not counted
    first, tool = [(1, 2, 0), (2, 0, 0)], (3, 1, 0)
    not_counted = response_mask.clone()
    not_counted[tool[:2]] = 0
    out, _, _ = _update(model, router_replay.Replay(_plant(routes, last + first + [tool]), not_counted),
                        pack=pack, coef=0.0)
    assert float(out[router_replay.MISMATCH]) == len(last) + len(first)
    assert float(out[router_replay.PAIRS]) == 2 * float(not_counted.sum())


@pytest.mark.parametrize("pack", [None, False], ids=["shared", "trim"])
def test_gradient_checkpointing_recomputes_with_the_replayed_routes(tiny_moe_dir, pack):
    """The recompute in backward runs the routers again: it must replay the same routes (else the
    gradients would be of another sub-network) and count nothing twice."""
    from rlctl.workers.compute.engine import checkpointing_kwargs

    model = _model(tiny_moe_dir, True)
    routes = _recorded(model, pack)
    _, _, response_mask = _rows()
    planted = router_replay.Replay(_plant(routes, [(0, 1, 0), (2, 3, 1)]), response_mask)
    out, loss, grads = _update(model, planted, pack=pack)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpointing_kwargs(model))
    model.train()
    again, loss_again, grads_again = _update(model, planted, pack=pack)
    assert torch.equal(again["log_prob"], out["log_prob"]) and torch.equal(loss_again, loss)
    assert all(torch.equal(grads_again[k], grads[k]) for k in grads)
    assert float(again[router_replay.MISMATCH]) == float(out[router_replay.MISMATCH]) == 2


def test_replay_records_nothing_outside_a_plan_and_a_dense_model_is_refused(tiny_moe_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from rlctl.models.tiny import build_tiny_model

    model = _model(tiny_moe_dir, True)
    ids, mask, _ = _rows()
    with torch.no_grad():
        plain = response_log_probs(_model(tiny_moe_dir, False), ids, mask, RESPONSE)
        installed = response_log_probs(model, ids, mask, RESPONSE)
    assert torch.equal(plain["log_prob"], installed["log_prob"]) and router_replay.COLUMN not in installed
    build_tiny_model(tmp_path / "dense", layers=1, hidden=32, heads=4, kv_heads=2)
    dense = AutoModelForCausalLM.from_pretrained(tmp_path / "dense")
    with pytest.raises(ConfigError, match="no mixture-of-experts layers"):
        router_replay.install(dense)


def test_mismatch_share_is_mismatched_pairs_over_pairs():
    metrics = {"pg_loss": 1.0, router_replay.MISMATCH: 3.0, router_replay.PAIRS: 12.0}
    assert router_replay.mismatch_share(metrics) == {"pg_loss": 1.0, "router_mismatch": 0.25}
    assert router_replay.mismatch_share({"pg_loss": 1.0}) == {"pg_loss": 1.0}


def test_replay_runs_the_log_prob_pass_even_where_one_update_would_skip_it():
    import dataclasses

    from rlctl.config.schema import Config
    from rlctl.controller.setup import recompute_old_log_prob

    off = Config()   # one optimizer step per rollout, on-policy: the update's own log-probs suffice
    on = dataclasses.replace(off, actor=dataclasses.replace(off.actor, router_replay=True))
    assert not recompute_old_log_prob(off, on_policy=True) and recompute_old_log_prob(on, on_policy=True)


def _planted_routes(rows: int, width: int, layers: int = 2, experts: int = 4) -> torch.Tensor:
    """Seeded random routes: k = 2 distinct experts per (row, token, layer), [rows, width, L, 2] uint8."""
    g = torch.Generator().manual_seed(11)
    picks = torch.stack([torch.randperm(experts, generator=g)[:2] for _ in range(rows * width * layers)])
    return picks.view(rows, width, layers, 2).to(torch.uint8)


def _replay_rank(rank, model_dir, init_file, out_dir, ep):
    """This rank's rows of test_expert_parallel's batch, planted routes replayed at `ep`: a token-mean
    -log pi plus 0.5 x aux, backward, expert grads reduced; rank 0 saves log-probs, counts, grads."""
    import torch.distributed as dist
    from test_expert_parallel import WIDTH, WORLD, _sharded_rank, _whole_grads

    from rlctl.workers.parallel import expert_parallel, fsdp

    model, groups, local, rows = _sharded_rank(rank, model_dir, init_file, ep)
    router_replay.install(model)
    mask, width = torch.ones_like(rows), WIDTH // 2
    response_mask = mask[:, width:].float()
    routes = _planted_routes(len(rows) * WORLD, width)[rank * len(rows):(rank + 1) * len(rows)]
    tokens, = fsdp.all_reduce_sum([float(response_mask.sum())])
    norm = LossNorm(tokens=tokens, dp_size=WORLD)
    out = response_log_probs(model, rows, mask, width, moe_aux=True, pack=False,
                             routes=router_replay.Replay(routes, response_mask))
    loss = moe_aux.add_aux_loss(aggregate_loss(-out["log_prob"], response_mask, "token-mean", norm=norm), {},
                                out, response_mask, norm, 0.5)
    loss.backward()
    if groups is not None:
        expert_parallel.reduce_expert_grads(local, groups)
    grads = _whole_grads(model, groups)
    counts = fsdp.all_reduce_sum([float(out[router_replay.MISMATCH]), float(out[router_replay.PAIRS])])
    log_probs = [torch.empty_like(out["log_prob"]) for _ in range(WORLD)]
    dist.all_gather(log_probs, out["log_prob"].detach())
    if rank == 0:
        np.savez(os.path.join(out_dir, "result.npz"), log_prob=torch.cat(log_probs).numpy(), counts=np.array(counts),
                 **{f"grad/{k}": v for k, v in grads.items()})
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_planted_routes_replayed_at_ep2_equal_ep1(tiny_moe_dir, tmp_path):
    """Tolerance as the aux-loss parity of test_expert_parallel.py: 2e-6 (float32 sums in another order)."""
    from test_expert_parallel import WORLD, _differences

    runs = {}
    for ep in (2, 1):
        out = tmp_path / f"replay_ep{ep}"
        out.mkdir()
        run_ranks(_replay_rank, (str(tiny_moe_dir), str(out / "pg"), str(out), ep), WORLD)
        runs[ep] = dict(np.load(out / "result.npz"))
    assert np.array_equal(runs[2]["counts"], runs[1]["counts"])
    mismatched, pairs = runs[2]["counts"]
    assert pairs == 2 * 4 * 6 and 0 < mismatched < pairs   # random routes: most differ from the router's
    diffs = _differences(runs[2], runs[1])
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] < 2e-6, (worst, diffs[worst])
    own = _recorded_log_prob(tiny_moe_dir)
    assert np.abs(runs[2]["log_prob"] - own).max() > 1e-3   # the planted routes did change the log-probs


def _recorded_log_prob(tiny_moe_dir) -> np.ndarray:
    """The log-probs of test_expert_parallel's batch with the model's own routes (one process)."""
    from test_expert_parallel import WIDTH, _batch

    rows = _batch()
    with torch.no_grad():
        out = response_log_probs(_model(tiny_moe_dir, False), rows, torch.ones_like(rows), WIDTH // 2, pack=False)
    return out["log_prob"].numpy()
