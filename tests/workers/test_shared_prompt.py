"""The shared-prompt layout (each prompt once, its n responses after it) computes exactly what the
row-by-row layout computes: log-probs, entropy, values and gradients, on a real tiny Qwen2."""

from __future__ import annotations

import pytest
import torch

from rlctl.workers.compute.logprob import choose_layout, make_layout, response_log_probs, response_values

P, T = 9, 6


def grouped_batch(seed: int = 0, prompts: int = 3, n: int = 3):
    """`prompts` random prompts of different lengths, each with n ragged responses (one of them
    empty), rows shuffled so the samples of a prompt are not neighbours."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((prompts * n, P + T), 259)
    mask = torch.zeros_like(ids)
    for i in range(prompts):
        plen = [2, P, 5][i % 3]
        prompt = torch.randint(0, 256, (plen,), generator=g)
        for s in range(n):
            r, tlen = i * n + s, (0 if (i, s) == (0, 0) else int(torch.randint(1, T + 1, (1,), generator=g)))
            ids[r, P - plen:P], mask[r, P - plen:P] = prompt, 1
            ids[r, P:P + tlen], mask[r, P:P + tlen] = torch.randint(0, 256, (tlen,), generator=g), 1
    order = torch.randperm(prompts * n, generator=g)
    return ids[order], mask[order]


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)


def _logp_and_grads(model, ids, mask, pack):
    model.zero_grad(set_to_none=True)
    out = response_log_probs(model, ids, mask, T, with_entropy=True, entropy_grad=True, pack=pack)
    (out["log_prob"].sum() + 0.1 * out["entropy"].sum()).backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    return out, grads


def test_shared_layout_is_chosen_and_holds_each_prompt_once(lm):
    ids, mask = grouped_batch()
    assert choose_layout(lm, ids.shape[1]) == "shared"
    layout = make_layout(ids, mask, T, layout="shared")
    prompt_tokens = 2 + P + 5                                   # the 3 distinct prompts, once each
    assert layout.input_ids.shape == (1, prompt_tokens + int(mask[:, P:].sum()))
    assert torch.equal(layout.targets, ids[:, P:][mask[:, P:].bool()])


def test_shared_layout_equals_row_by_row_with_gradients(lm):
    ids, mask = grouped_batch(seed=1)
    lm.train()
    want, want_grads = _logp_and_grads(lm, ids, mask, pack=False)   # trim: every row on its own
    got, got_grads = _logp_and_grads(lm, ids, mask, pack=None)      # shared (the default here)
    assert torch.allclose(got["log_prob"], want["log_prob"], atol=1e-5, rtol=0)
    assert torch.allclose(got["entropy"], want["entropy"], atol=1e-5, rtol=0)
    assert (got["log_prob"][mask[:, P:].sum(1) == 0] == 0).all()   # the empty response stays 0
    assert want_grads.keys() == got_grads.keys()
    for name, grad in want_grads.items():
        assert torch.allclose(got_grads[name], grad, atol=1e-5, rtol=1e-4), name


def test_gradient_checkpointing_falls_back_to_rows(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert choose_layout(model, P + T) == "trim"     # recompute runs outside the shared attention


def test_critic_values_match_row_by_row(tiny_model_dir):
    from rlctl.config.schema import ModelConfig
    from rlctl.workers.compute.models import load_value_model

    torch.manual_seed(0)
    critic = load_value_model(str(tiny_model_dir), ModelConfig(path=str(tiny_model_dir))).eval()
    ids, mask = grouped_batch(seed=2)
    assert choose_layout(critic, ids.shape[1]) == "shared"
    with torch.no_grad():
        assert torch.allclose(response_values(critic, ids, mask, T), response_values(critic, ids, mask, T, pack=False),
                              atol=1e-5, rtol=0)


def test_lora_policy_and_its_reference_match_row_by_row(tiny_model_dir):
    from rlctl.config.schema import LoraConfig, ModelConfig
    from rlctl.workers.compute.models import apply_lora, load_causal_lm

    torch.manual_seed(0)
    model = apply_lora(load_causal_lm(ModelConfig(path=str(tiny_model_dir))), LoraConfig(rank=4))
    for p in model.parameters():                     # non-zero adapters, so on and off differ
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.05)
    ids, mask = grouped_batch(seed=3)
    with torch.no_grad():
        for adapters in (True, False):
            ctx = model.disable_adapter() if not adapters else torch.enable_grad()
            with ctx:
                got = response_log_probs(model, ids, mask, T)["log_prob"]
                want = response_log_probs(model, ids, mask, T, pack=False)["log_prob"]
            assert torch.allclose(got, want, atol=1e-5, rtol=0)


def test_checkpointed_engine_recomputes_with_shared_attention(tiny_model_dir):
    """The engine's gradient checkpointing re-enters shared-prompt attention in backward, so a
    checkpointed model keeps the shared layout and still gets the row-by-row gradients."""
    from rlctl.config.schema import ModelConfig
    from rlctl.workers.compute.engine import OptimSpec, TrainEngine
    from rlctl.workers.compute.models import load_causal_lm

    spec = OptimSpec(lr=1e-3, weight_decay=0.0, grad_clip=0.0, warmup_steps=0, total_steps=1)
    engine = TrainEngine(load_causal_lm(ModelConfig(path=str(tiny_model_dir))), spec, compute_dtype=torch.float32,
                         gradient_checkpointing=True)
    ids, mask = grouped_batch(seed=4)
    assert choose_layout(engine.module, ids.shape[1]) == "shared"
    _, got = _logp_and_grads(engine.module, ids, mask, pack=None)
    _, want = _logp_and_grads(engine.module, ids, mask, pack=False)
    for name, grad in want.items():
        assert torch.allclose(got[name], grad, atol=1e-5, rtol=1e-4), name


@pytest.mark.parametrize("causal", [True, False])
def test_grouped_attention_equals_torch_attention_with_gradients(causal):
    """The half-precision CPU path (plain matmuls, each KV head's query heads stacked) is the same
    math as scaled_dot_product_attention with grouped KV heads: checked in float32, where both are exact."""
    from rlctl.workers.compute.shared_prompt import _grouped_attention, _sdpa

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=g, requires_grad=True) for shape in
               ((5, 6, 7, 16), (5, 2, 7 if causal else 11, 16), (5, 2, 7 if causal else 11, 16)))
    allowed = None if causal else torch.rand(5, 1, 7, 11, generator=g) > 0.3
    if allowed is not None:
        allowed[..., 0] = True                       # no fully masked row, as in the shared layout
    outs, grads = [], []
    for attend in (_sdpa, _grouped_attention):
        out = attend(q, k, v, allowed, 0.3)
        outs.append(out)
        grads.append(torch.autograd.grad((out * torch.linspace(-1, 1, 16)).sum(), (q, k, v)))
    assert torch.allclose(outs[0], outs[1], atol=1e-5)
    for want, got in zip(*grads):
        assert torch.allclose(want, got, atol=1e-5)


def test_bfloat16_autocast_takes_the_matmul_path_and_stays_close_to_float32(lm, monkeypatch):
    from rlctl.workers.compute import shared_prompt

    taken = []
    grouped = shared_prompt._grouped_attention
    monkeypatch.setattr(shared_prompt, "_grouped_attention", lambda *a: taken.append(a[0].dtype) or grouped(*a))
    ids, mask = grouped_batch(seed=2)
    with torch.no_grad():
        want = response_log_probs(lm, ids, mask, T)["log_prob"]
        assert taken == []                           # float32 keeps torch's attention
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = response_log_probs(lm, ids, mask, T)["log_prob"]
    assert taken and len(taken) % 2 == 0             # a prompt and a response call per layer
    assert (got - want).abs().max() < 0.1 and (got[mask[:, P:].sum(1) == 0] == 0).all()
