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
from support.gloo_ranks import run_ranks

WORLD, ROWS, WIDTH = 2, 4, 12


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
    from rlctl.workers.parallel.expert_parallel import expert_modules, is_split

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
    from rlctl.workers.parallel import expert_parallel

    original = expert_parallel.dispatch

    def planted(hidden, index, weights, *, local_forward, **kwargs):
        def wrong(x, ids, w):
            ids = ids.clone()
            if len(ids):
                ids[0] = (ids[0] + 1) % kwargs["local_experts"]
            return local_forward(x, ids, w)
        return original(hidden, index, weights, local_forward=wrong, **kwargs)

    expert_parallel.dispatch = planted


def _sharded_rank(rank, model_dir, init_file, ep, plant=False):
    """This rank's gloo group, the tiny MoE split at `ep` (experts left out of FSDP) and sharded, and its
    rows of the batch: (model, expert groups or None, the rank's expert tensors, rows)."""
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from rlctl.workers.parallel import expert_parallel, fsdp

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    groups, local = None, []
    if ep > 1:
        groups = expert_parallel.new_groups(ep)
        local = expert_parallel.split_experts(model, groups)
        if plant:
            _plant_misroute()
    fsdp.shard(model, ignored=set(local) or None)
    return model, groups, local, _batch()[rank * ROWS // WORLD:(rank + 1) * ROWS // WORLD]


def _rank_main(rank, model_dir, init_file, out_dir, ep, plant):
    import torch.distributed as dist

    from rlctl.workers.parallel import expert_parallel, fsdp

    model, groups, local, rows = _sharded_rank(rank, model_dir, init_file, ep, plant)
    out = _forward_backward(model, rows, WORLD)
    if groups is not None:
        expert_parallel.reduce_expert_grads(local, groups)
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
    run_ranks(_rank_main, (str(model_dir), str(out / "pg"), str(out), ep, plant), WORLD)
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
def test_ep2_equals_ep1_and_one_process_and_a_misrouted_token_fails(tiny_moe_dir, tmp_path):
    ep2 = _run(tiny_moe_dir, tmp_path, "ep2", ep=2)
    ep1 = _run(tiny_moe_dir, tmp_path, "ep1", ep=1)
    one = _one_process(tiny_moe_dir)
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

    planted = _run(tiny_moe_dir, tmp_path, "planted", ep=2, plant=True)
    diffs = _differences(planted, ep1)
    assert diffs["logits"] > 1e-4 and diffs["grad/model.layers.0.mlp.experts.gate_up_proj"] > 1e-4, diffs


FAMILIES = {"qwen2_moe": {"num_experts": 4, "moe_intermediate_size": 16, "shared_expert_intermediate_size": 32},
            "mixtral": {"num_local_experts": 4}, "olmoe": {"num_experts": 4}}


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ep2_equals_ep1_on_the_other_moe_families_it_accepts(tmp_path):
    """Qwen2-MoE (with its shared expert), Mixtral and OLMoE: the families validate accepts beside
    Qwen3-MoE (rlctl.workers.parallel.expert_parallel.TESTED_FAMILIES) split at ep = 2 as at ep = 1."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from rlctl.workers.parallel.expert_parallel import TESTED_FAMILIES

    assert set(FAMILIES) | {"qwen3_moe"} == set(TESTED_FAMILIES)
    for family, experts in FAMILIES.items():
        torch.manual_seed(0)
        config = AutoConfig.for_model(family, vocab_size=200, hidden_size=32, intermediate_size=32,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                      num_experts_per_tok=2, router_aux_loss_coef=0.01, **experts)
        AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / family)
        ep2 = _run(tmp_path / family, tmp_path, f"{family}-ep2", ep=2)
        ep1 = _run(tmp_path / family, tmp_path, f"{family}-ep1", ep=1)
        diffs = _differences(ep2, ep1)
        worst = max(diffs, key=diffs.get)
        assert diffs[worst] < 2e-6, (family, worst, diffs[worst])
        assert all(np.abs(v).max() > 0 for k, v in ep2.items() if "experts" in k), family


def _engine_main(rank, model_dir, init_file, out_dir, ep):
    """One GRPO-style step of rlctl's TrainEngine at expert_parallel_size = ep: hf generation and
    the log-prob pass with different micro-batch counts per rank (experts gathered), the update
    (all-to-all dispatch), the weight push, a checkpoint saved and loaded back."""
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from rlctl.algorithms import policy_loss
    from rlctl.runtime.batch import Batch
    from rlctl.runtime.policy import rollout_batch
    from rlctl.workers.compute.engine import OptimSpec, TrainEngine
    from rlctl.workers.compute.logprob import batched_response_outputs, response_log_probs
    from rlctl.workers.compute.training import run_updates
    from rlctl.workers.parallel import fsdp
    from rlctl.workers.rollout.hf import HFRolloutEngine
    from rlctl.workers.rollout.weights import engine_weights

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    spec = OptimSpec(lr=1e-2, weight_decay=0.0, grad_clip=0.05, warmup_steps=0, total_steps=1)

    def build():
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        return TrainEngine(model, spec, compute_dtype=torch.float32, expert_parallel_size=ep)

    engine = build()
    prompts = [[5 + rank, 17, 30, 41], [9, 60 + rank]]
    ids, mask = np.zeros((2, 4), np.int64), np.zeros((2, 4), np.int64)
    for i, p in enumerate(prompts):
        ids[i, 4 - len(p):], mask[i, 4 - len(p):] = p, 1
    out = HFRolloutEngine(engine.module, pad_token_id=0, eos_token_ids=[1]).generate(
        prompts, n=2, max_new_tokens=3 + rank, generator=torch.Generator().manual_seed(rank))
    batch = rollout_batch(Batch({"input_ids": ids, "attention_mask": mask}), out, 2, width=4, pad=0)
    horizon = batch["response_mask"].shape[1]
    with engine.inference() as module:   # rank 0: 4 forwards, rank 1: 1
        old = batched_response_outputs(module, engine.device, batch, 1 if rank == 0 else 4)["log_prob"]
    batch = Batch({**{k: batch[k] for k in ("input_ids", "attention_mask", "response_mask")}, "old_log_prob": old,
                   "advantages": np.random.default_rng(rank).standard_normal(old.shape).astype(np.float32)})

    def make_loss(norm):
        def loss_fn(micro):
            lp = response_log_probs(engine.module, micro["input_ids"], micro["attention_mask"], horizon)["log_prob"]
            return policy_loss("vanilla", old_log_prob=micro["old_log_prob"], log_prob=lp,
                               advantages=micro["advantages"], response_mask=micro["response_mask"], norm=norm)
        return loss_fn

    metrics = run_updates(engine, batch, epochs=1, mini_batches=1, micro_batch_size=2, horizon=horizon,
                          make_loss=make_loss, keys=["input_ids", "attention_mask", "response_mask", "old_log_prob",
                                                     "advantages"])
    with fsdp.whole_weights(engine.module):
        weights = {k: v.clone().numpy() for k, v in engine_weights(engine.module)}
    # outside whole_weights (the vLLM push, the one-step-off export) each bank is gathered on the way
    streamed = {k: v.clone().numpy() for k, v in engine_weights(engine.module)}
    assert streamed.keys() == weights.keys() and all(np.array_equal(streamed[k], weights[k]) for k in weights)
    partial_refused = _planted_partial_push(engine.module) if ep > 1 else ""
    engine.save(os.path.join(out_dir, "ckpt"))
    again = build()
    again.load(os.path.join(out_dir, "ckpt"))
    with fsdp.whole_weights(again.module):
        reloaded = {k: v.clone().numpy() for k, v in engine_weights(again.module)}
    assert all(np.array_equal(weights[k], reloaded[k]) for k in weights), "checkpoint did not restore the weights"
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), responses=batch["input_ids"], old=old,
             partial_refused=partial_refused, **{f"metric/{k}": v for k, v in metrics.items()},
             **({f"w/{k}": v for k, v in weights.items()} if rank == 0 else {}))
    dist.destroy_process_group()


def _planted_partial_push(module) -> str:
    """A push whose gather is broken (each rank keeps its own share of the bank) must raise."""
    from unittest import mock

    from rlctl.workers.parallel import expert_parallel
    from rlctl.workers.rollout.weights import engine_weights

    with mock.patch.object(expert_parallel, "_gather_bank", lambda m, p: getattr(m, p).detach()):
        try:
            list(engine_weights(module))
        except RuntimeError as err:
            return str(err)
    return "no error"


def _run_engine(model_dir, tmp_path, ep) -> list[dict]:
    out = tmp_path / f"engine_ep{ep}"
    out.mkdir()
    run_ranks(_engine_main, (str(model_dir), str(out / "pg"), str(out), ep), WORLD)
    return [dict(np.load(out / f"rank{r}.npz")) for r in range(WORLD)]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_one_grpo_step_of_the_engine_at_ep2_equals_ep1_and_its_checkpoint_loads_in_one_process(tiny_moe_dir, tmp_path):
    """Tolerances: log-probs 1e-5, metrics rtol 1e-5, updated weights 1e-5 = 1/1000 of the step: Adam's
    first step is lr * g / (|g| + eps) per element, so float32 rounding of the two summation orders in
    a tiny gradient shows in the weights (measured: 3e-6 at lr 1e-2, clipped)."""
    from transformers import AutoModelForCausalLM

    from rlctl.workers.compute.engine import OptimSpec, TrainEngine
    from rlctl.workers.rollout.weights import engine_weights

    ep2, ep1 = _run_engine(tiny_moe_dir, tmp_path, 2), _run_engine(tiny_moe_dir, tmp_path, 1)
    for a, b in zip(ep2, ep1):
        assert np.array_equal(a["responses"], b["responses"])   # same samples from the gathered experts
        np.testing.assert_allclose(a["old"], b["old"], atol=1e-5)
        for key in (k for k in a if k.startswith("metric/")):
            np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-6, err_msg=key)
    assert str(ep2[0]["partial_refused"]) == ("model.layers.0.mlp.experts.gate_up_proj holds 2 of 4 experts: refusing "
                                              "to send a partial expert set")
    weights = [k for k in ep2[0] if k.startswith("w/")]
    assert weights == [k for k in ep1[0] if k.startswith("w/")]
    assert ep2[0]["w/model.layers.1.mlp.experts.down_proj"].shape[0] == 4
    worst = max(float(np.abs(ep2[0][k] - ep1[0][k]).max()) for k in weights)
    assert worst < 1e-5, worst
    # the ep=2 checkpoint loads in one process (as rlctl merge and a resume at ep=1 do), every expert whole
    one = TrainEngine(AutoModelForCausalLM.from_pretrained(tiny_moe_dir, dtype=torch.float32),
                      OptimSpec(lr=1e-2, weight_decay=0.0, grad_clip=0.05, warmup_steps=0, total_steps=1),
                      compute_dtype=torch.float32)
    initial = {name: tensor.detach().clone().numpy() for name, tensor in engine_weights(one.module)}
    one.load(str(tmp_path / "engine_ep2" / "ckpt"))
    for name, tensor in engine_weights(one.module):
        assert np.array_equal(tensor.detach().numpy(), ep2[0][f"w/{name}"]), name
    bank = "model.layers.0.mlp.experts.gate_up_proj"
    assert np.abs(ep2[0][f"w/{bank}"] - initial[bank]).max() > 1e-4   # the update trained the experts


def _aux_main(rank, model_dir, init_file, out_dir, ep):
    """The update's MoE term (rlctl.workers.parallel.moe_aux) on this rank's padded prompt ++ response rows:
    a token-mean -log pi plus coef x aux, backward, expert grads reduced; rank 0 saves the global
    aux metric and every gradient."""
    import torch.distributed as dist

    from rlctl.algorithms import LossNorm, aggregate_loss
    from rlctl.workers.compute.logprob import response_log_probs
    from rlctl.workers.parallel import expert_parallel, fsdp, moe_aux

    model, groups, local, rows = _sharded_rank(rank, model_dir, init_file, ep)
    mask = torch.ones_like(rows)
    mask[0, :2 + rank] = 0            # left-padded prompts, right-padded responses
    mask[1, WIDTH - 3:] = 0
    response_mask = mask[:, WIDTH // 2:]
    tokens, = fsdp.all_reduce_sum([float(response_mask.sum())])
    norm = LossNorm(tokens=tokens, dp_size=WORLD)
    out = response_log_probs(model, rows * mask, mask, WIDTH // 2, moe_aux=True, pack=False)
    metrics = {}
    loss = moe_aux.add_aux_loss(aggregate_loss(-out["log_prob"], response_mask, "token-mean", norm=norm), metrics,
                                out, response_mask, norm, 0.5)
    loss.backward()
    if groups is not None:
        expert_parallel.reduce_expert_grads(local, groups)
    grads = _whole_grads(model, groups)
    aux, = fsdp.all_reduce_sum([metrics[moe_aux.METRIC] / WORLD])
    if rank == 0:
        np.savez(os.path.join(out_dir, "result.npz"), aux=aux, **{f"grad/{k}": v for k, v in grads.items()})
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_updates_moe_aux_loss_and_its_gradients_at_ep2_equal_ep1(tiny_moe_dir, tmp_path):
    runs = {}
    for ep in (2, 1):
        out = tmp_path / f"aux_ep{ep}"
        out.mkdir()
        run_ranks(_aux_main, (str(tiny_moe_dir), str(out / "pg"), str(out), ep), WORLD)
        runs[ep] = dict(np.load(out / "result.npz"))
    diffs = _differences(runs[2], runs[1])
    worst = max(diffs, key=diffs.get)
    assert diffs[worst] < 2e-6, (worst, diffs[worst])
    assert float(runs[2]["aux"]) > 1.0   # k = 2 when balanced: a real value, not a missing term
    assert np.abs(runs[2]["grad/model.layers.0.mlp.gate.weight"]).max() > 0
