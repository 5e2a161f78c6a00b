"""The MoE load-balancing loss in the update (rlctl.workers.parallel.moe_aux), in one process on a tiny
Qwen3-MoE: it is transformers' aux_loss over the real tokens only (the padded trim layout and the
packed layout give the same value, a forward over the padding another), coefficient 0 leaves the
loss and its gradients exactly as without it, and the coefficient comes from the model's config
unless actor.moe_aux_loss_coef says otherwise. The ep = 2 parity is in test_expert_parallel.py."""

from __future__ import annotations

import pytest
import torch

from rlctl.algorithms import LossNorm, aggregate_loss
from rlctl.errors import ConfigError
from rlctl.workers.compute.logprob import response_log_probs
from rlctl.workers.parallel import moe_aux

PROMPT, RESPONSE = 5, 4


def _model(path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def _rows():
    """3 rows of a left-padded prompt and a right-padded response, lengths differing."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, 200, (3, PROMPT + RESPONSE), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :2] = 0
    mask[1, PROMPT + 2:] = 0
    mask[2, :1] = 0
    mask[2, PROMPT + 3:] = 0
    ids = ids * mask
    return ids, mask, mask[:, PROMPT:]


def _loss(model, coef, pack=False):
    ids, mask, response_mask = _rows()
    model.zero_grad(set_to_none=True)
    out = response_log_probs(model, ids, mask, RESPONSE, moe_aux=coef > 0, pack=pack)
    norm = LossNorm(tokens=float(response_mask.sum()), dp_size=1)
    loss = aggregate_loss(-out["log_prob"], response_mask, "token-mean", norm=norm)
    metrics = {}
    total = moe_aux.add_aux_loss(loss, metrics, out, response_mask, norm, coef)
    total.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    return loss, total, metrics, grads, out


def test_aux_loss_is_transformers_over_the_real_tokens_only(tiny_moe_dir):
    model = _model(tiny_moe_dir)
    _, _, trim, _, _ = _loss(model, 0.01, pack=False)
    _, _, packed, _, _ = _loss(model, 0.01, pack=True)
    assert abs(trim[moe_aux.METRIC] - packed[moe_aux.METRIC]) < 1e-6, (trim, packed)
    ids, mask, _ = _rows()
    with torch.no_grad():   # the same rows with their padding routed too: a different value
        padded = float(model(input_ids=ids, output_router_logits=True, use_cache=False).aux_loss)
        # the real tokens alone, one row at a time, the counts pooled as transformers pools layers
        real = [ids[i][mask[i].bool()][None] for i in range(len(ids))]
        joined = float(model(input_ids=torch.cat(real, 1), position_ids=torch.cat(
            [torch.arange(r.shape[1])[None] for r in real], 1), output_router_logits=True, use_cache=False).aux_loss)
    assert abs(padded - trim[moe_aux.METRIC]) > 1e-4
    assert abs(joined - trim[moe_aux.METRIC]) < 1e-6
    top_k, experts = model.config.num_experts_per_tok, model.config.num_experts
    assert top_k - 1e-4 <= trim[moe_aux.METRIC] <= experts   # k when balanced, E when collapsed


def test_coefficient_zero_leaves_the_loss_and_gradients_exactly_as_they_were(tiny_moe_dir):
    model = _model(tiny_moe_dir)
    loss, total, metrics, grads, out = _loss(model, 0.0)
    assert total is loss and metrics == {} and moe_aux.METRIC not in out   # no router logits asked for
    on_loss, on_total, on_metrics, on_grads, _ = _loss(model, 0.5)
    assert torch.equal(loss, on_loss)   # the policy term itself is unchanged
    assert abs(float((on_total - on_loss).detach()) - 0.5 * on_metrics[moe_aux.METRIC]) < 1e-6
    router = "model.layers.0.mlp.gate.weight"
    assert not torch.equal(grads[router], on_grads[router])   # the aux term trains the router
    plain = dict(grads)
    _, _, _, again, _ = _loss(model, 0.0)
    assert all(torch.equal(plain[k], again[k]) for k in plain)


def test_the_coefficient_comes_from_the_model_unless_set(tiny_moe_dir, tmp_path):
    from rlctl.models.tiny import build_tiny_model

    model = _model(tiny_moe_dir)
    assert model.config.router_aux_loss_coef > 0
    assert moe_aux.resolve_coef(model, -1.0) == pytest.approx(model.config.router_aux_loss_coef)
    assert moe_aux.resolve_coef(model, 0.25) == 0.25
    assert moe_aux.resolve_coef(model, 0.0) == 0.0
    with pytest.raises(ConfigError, match="sequence parallelism"):
        moe_aux.resolve_coef(model, -1.0, sp_size=2)
    assert moe_aux.resolve_coef(model, 0.0, sp_size=2) == 0.0
    build_tiny_model(tmp_path / "dense", layers=1, hidden=32, heads=4, kv_heads=2, intermediate=64)
    assert moe_aux.resolve_coef(_model(tmp_path / "dense"), 0.25) == 0.0   # a dense policy has no router
