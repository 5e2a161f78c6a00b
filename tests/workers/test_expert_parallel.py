"""Expert parallelism on two real gloo ranks, composed with rlctl's FSDP2 wrapping, on a tiny
Qwen3-MoE (4 experts, top-2, 2 layers): ep = 2 gives the logits, loss, auxiliary (load-balancing)
loss and every gradient of ep = 1 over the same two ranks and of one process on the whole batch,
within float32 rounding; a planted misrouted token (one row handed to the wrong local expert)
breaks the equality, so the comparison can fail."""

from __future__ import annotations

import datetime
import os

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

WORLD, ROWS, WIDTH = 2, 4, 12


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory):
    from rlctl.models.tiny import build_tiny_model

    out = tmp_path_factory.mktemp("tiny_moe")
    build_tiny_model(out, arch="qwen3_moe", layers=2, hidden=32, heads=4, kv_heads=2, intermediate=64)
    return out


def _batch() -> torch.Tensor:
    return torch.randint(3, 200, (ROWS, WIDTH), generator=torch.Generator().manual_seed(7))


def _forward_backward(model, rows: torch.Tensor, world: int) -> dict:
    """Token-mean next-token CE over the *global* batch (this rank's sum / all tokens x W, as
    rlctl's LossNorm: FSDP averages over W) plus the model's router aux loss, backward."""
    out = model(input_ids=rows, output_router_logits=True, use_cache=False)
    logits = out.logits[:, :-1].float()
    ce_sum = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), rows[:, 1:].reshape(-1),
                                               reduction="sum")
    ce = ce_sum / (ROWS * (WIDTH - 1)) * world
    loss = ce + model.config.router_aux_loss_coef * out.aux_loss
    loss.backward()
    return {"logits": out.logits.detach().numpy(), "ce": float(ce.detach()) / world, "aux": float(out.aux_loss.detach())}


def _whole_grads(model, groups) -> dict[str, np.ndarray]:
    from rlctl.workers.expert_parallel import expert_modules, is_split

    grads = {}
    for name, p in model.named_parameters():
        g = p.grad
        grads[name] = (g.full_tensor() if hasattr(g, "full_tensor") else g).detach().numpy().copy()
    if groups is not None:
        import torch.distributed as dist

        for name, module in expert_modules(model):
            if is_split(module):
                for pname in ("gate_up_proj", "down_proj"):
                    part = getattr(module, pname).grad
                    pieces = [torch.empty_like(part) for _ in range(groups.ep_size)]
                    dist.all_gather(pieces, part, group=groups.ep_group)
                    grads[f"{name}.{pname}"] = torch.cat(pieces).numpy()
    return grads


def _plant_misroute():
    """A dispatch bug: the first row a rank's experts receive goes to the wrong local expert."""
    from rlctl.workers import expert_parallel

    original = expert_parallel.dispatch

    def planted(hidden, index, weights, *, local_forward, **kwargs):
        def wrong(x, ids, w):
            ids = ids.clone()
            if len(ids):
                ids[0] = (ids[0] + 1) % kwargs["local_experts"]
            return local_forward(x, ids, w)
        return original(hidden, index, weights, local_forward=wrong, **kwargs)

    expert_parallel.dispatch = planted


def _rank_main(rank, model_dir, init_file, out_dir, ep, plant):
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from rlctl.workers import expert_parallel, fsdp

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    groups, local = None, set()
    if ep > 1:
        groups = expert_parallel.new_groups(ep)
        local = set(expert_parallel.split_experts(model, groups))
        if plant:
            _plant_misroute()
    fsdp.shard(model, ignored=local)
    rows = _batch()[rank * ROWS // WORLD:(rank + 1) * ROWS // WORLD]
    out = _forward_backward(model, rows, WORLD)
    if groups is not None:
        expert_parallel.reduce_expert_grads(sorted(local, key=id), groups)
    grads = _whole_grads(model, groups)
    if rank == 0:
        ce, aux = fsdp.all_reduce_sum([out["ce"], out["aux"] / WORLD])
    else:
        fsdp.all_reduce_sum([out["ce"], out["aux"] / WORLD])
    logits = [torch.empty(out["logits"].shape) for _ in range(WORLD)]
    dist.all_gather(logits, torch.from_numpy(out["logits"]))
    if rank == 0:
        np.savez(os.path.join(out_dir, "result.npz"), logits=torch.cat(logits).numpy(), ce=ce, aux=aux,
                 **{f"grad/{k}": v for k, v in grads.items()})
    dist.destroy_process_group()


def _run(model_dir, tmp_path, name, *, ep, plant=False) -> dict:
    out = tmp_path / name
    out.mkdir()
    mp.start_processes(_rank_main, args=(str(model_dir), str(out / "pg"), str(out), ep, plant),
                       nprocs=WORLD, join=True, start_method="spawn")
    return dict(np.load(out / "result.npz"))


def _one_process(model_dir) -> dict:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    out = _forward_backward(model, _batch(), 1)
    return {"logits": out["logits"], "ce": out["ce"], "aux": out["aux"],
            **{f"grad/{k}": p.grad.numpy().copy() for k, p in model.named_parameters()}}


def _differences(a: dict, b: dict) -> dict[str, float]:
    assert set(a) == set(b), sorted(set(a) ^ set(b))
    return {k: float(np.abs(np.asarray(a[k]) - np.asarray(b[k])).max()) for k in a}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ep2_equals_ep1_and_one_process_and_a_misrouted_token_fails(moe_dir, tmp_path):
    ep2 = _run(moe_dir, tmp_path, "ep2", ep=2)
    ep1 = _run(moe_dir, tmp_path, "ep1", ep=1)
    one = _one_process(moe_dir)
    assert ep2["grad/model.layers.0.mlp.experts.gate_up_proj"].shape[0] == 4   # every expert gathered
    diffs = _differences(ep2, ep1)
    worst = max(diffs, key=diffs.get)
    print("ep2 vs ep1, largest |difference|:", worst, diffs[worst])
    assert diffs[worst] < 2e-6, (worst, diffs[worst])
    # one process on the whole batch: the same logits and CE; not the aux loss (transformers takes it
    # over each rank's own rows, with or without ep) nor, through it, the gradients
    for key in ("logits", "ce"):
        assert np.abs(ep2[key] - one[key]).max() < 2e-6, key
    assert all(np.abs(v).max() > 0 for k, v in ep2.items() if "experts" in k)   # every bank was trained

    planted = _run(moe_dir, tmp_path, "planted", ep=2, plant=True)
    diffs = _differences(planted, ep1)
    assert diffs["logits"] > 1e-4 and diffs["grad/model.layers.0.mlp.experts.gate_up_proj"] > 1e-4, diffs
