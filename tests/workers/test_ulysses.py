"""Ulysses sequence parallelism on two real gloo ranks against one rank on the same micro-batch.

Both ranks hold the same ragged micro-batch (odd lengths, padding, an empty response, a response
mask with a hole as multi-turn rollouts make it); with sp = 2
each runs half of the packed row and the all-to-all attention. Log-probs, entropy, loss, critic
values and the summed gradients must equal the plain one-rank forward (trim layout, SDPA) within
float32 rounding, for KV heads that split over the ranks and KV heads repeated (1 KV head, sp = 2).
LoRA adapters and a gradient-checkpointed model get the same gradients; a bfloat16 model lands as close to float32 as one rank does.
A planted wrong mask (plain causal over the whole packed row) must break the parity. A Gemma 3
model past its sliding window, with soft-capped logits, keeps the parity too.
"""

from __future__ import annotations

import datetime
import os

import numpy as np
import pytest
import torch

from rlctl.workers.parallel import ulysses
from support.gloo_ranks import run_ranks

SP = 2
TOL = 1e-5


def _model(kv_heads: int, value: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM, LlamaForTokenClassification

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=64,
                         attn_implementation="sdpa", num_labels=1)
    return (LlamaForTokenClassification if value else LlamaForCausalLM)(config).float()


def _loss(out: dict, micro: dict) -> torch.Tensor:
    mask = micro["response_mask"]
    tokens = mask.sum()
    entropy = (out["entropy"] * mask).sum() / tokens
    return -(out["log_prob"] * micro["advantages"] * mask).sum() / tokens - 0.01 * entropy


def _policy_pass(model, micro: dict, width: int, sp=None) -> dict:
    from rlctl.workers.compute.logprob import response_log_probs

    model.zero_grad(set_to_none=True)
    out = response_log_probs(model, micro["input_ids"], micro["attention_mask"], width, with_entropy=True,
                             entropy_grad=True, pack=False, temperature=0.7, sp=sp)
    loss = _loss(out, micro)
    loss.backward()
    grads = torch.cat([p.grad.flatten().float() for p in model.parameters() if p.grad is not None])
    return {"log_prob": out["log_prob"].detach(), "entropy": out["entropy"].detach(), "loss": loss.detach(),
            "grad": grads}


def _rank_main(rank, init_file, out_dir):
    import torch.distributed as dist
    from worker_fixtures import ragged_batch

    from rlctl.workers.compute.logprob import response_values

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=SP,
                            timeout=datetime.timedelta(seconds=60))
    sp = ulysses.new_groups(SP)
    micro = {k: torch.as_tensor(v) for k, v in ragged_batch(rows=5, prompt_width=7, response_width=6, seed=3).items()}
    micro["response_mask"][:, 2] = 0   # a multi-turn mask: a tool's output inside the response takes no loss
    width = micro["response_mask"].shape[1]
    results = {}
    for kv in (2, 1):
        model = _model(kv)
        one = _policy_pass(model, micro, width)
        split = _policy_pass(model, micro, width, sp=sp)
        dist.all_reduce(split["grad"])
        split["grad"] /= SP   # the S ranks' gradients sum to S x dL/dtheta (rlctl.workers.parallel.ulysses)
        for key in one:
            results[f"kv{kv}_{key}"] = float((one[key] - split[key]).abs().max())
        results[f"kv{kv}_grad_scale"] = float(one["grad"].abs().max())
    critic = _model(2, value=True).eval()   # the token classifier's head dropout off, as rlctl's critic has it
    with torch.no_grad():
        plain = response_values(critic, micro["input_ids"], micro["attention_mask"], width, pack=False)
        split = response_values(critic, micro["input_ids"], micro["attention_mask"], width, sp=sp)
    results["values"] = float((plain - split).abs().max())
    results["values_scale"] = float(plain.abs().max())
    results.update(_lora(sp, micro, width))
    results.update(_checkpointed(sp, micro, width))
    results.update(_bf16(sp, micro, width))
    results.update(_planted_wrong_mask(sp, micro, width))
    results.update(_windowed(sp, micro, width))
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **results)
    dist.destroy_process_group()


def _lora(sp, micro, width) -> dict:
    """LoRA adapters on q/v (B not zero, so A gets gradients): only the adapters train."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(_model(2), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0, 0.1)
    one = _policy_pass(model, micro, width)
    split = _policy_pass(model, micro, width, sp=sp)
    torch.distributed.all_reduce(split["grad"])
    split["grad"] /= SP
    return {"lora_log_prob": float((one["log_prob"] - split["log_prob"]).abs().max()),
            "lora_grad": float((one["grad"] - split["grad"]).abs().max()), "lora_grad_scale": float(one["grad"].abs().max())}


def _checkpointed(sp, micro, width) -> dict:
    """Gradient checkpointing as the engine enables it (TrainEngine; here without FSDP): the
    recompute in backward runs Ulysses attention too."""
    from rlctl.workers.compute.engine import checkpointing_kwargs

    one = _policy_pass(_model(2), micro, width)
    model = _model(2)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=checkpointing_kwargs(model))
    split = _policy_pass(model, micro, width, sp=sp)
    torch.distributed.all_reduce(split["grad"])
    split["grad"] /= SP
    return {"gc_log_prob": float((one["log_prob"] - split["log_prob"]).abs().max()),
            "gc_grad": float((one["grad"] - split["grad"]).abs().max()), "gc_grad_scale": float(one["grad"].abs().max())}


def _bf16(sp, micro, width) -> dict:
    """A bfloat16 model: sp = 2 lands as close to the float32 log-probs as one rank in bfloat16 does."""
    exact = _policy_pass(_model(2), micro, width)["log_prob"]
    model = _model(2).to(torch.bfloat16)
    one = _policy_pass(model, micro, width)
    split = _policy_pass(model, micro, width, sp=sp)
    return {"bf16_one_error": float((one["log_prob"] - exact).abs().max()),
            "bf16_sp_error": float((split["log_prob"] - exact).abs().max())}


def _planted_wrong_mask(sp, micro, width) -> dict:
    """Plain causal attention over the whole packed row: later sequences see earlier ones' tokens."""
    model = _model(2)
    one = _policy_pass(model, micro, width)
    right = ulysses.sequence_lengths
    ulysses.sequence_lengths = lambda positions: [len(positions)]
    try:
        wrong = _policy_pass(model, micro, width, sp=sp)
    finally:
        ulysses.sequence_lengths = right
    return {"wrong_mask_log_prob": float((one["log_prob"] - wrong["log_prob"]).abs().max())}


def _windowed(sp, micro, width) -> dict:
    """A Gemma 3 model whose 3-token window the sequences pass, with soft-capped logits: sp = 2
    equals one rank in transformers' eager attention (log-probs and gradients)."""
    model = _gemma3()
    one = _policy_pass(model, micro, width)
    split = _policy_pass(model, micro, width, sp=sp)
    torch.distributed.all_reduce(split["grad"])
    split["grad"] /= SP
    return {"window_log_prob": float((one["log_prob"] - split["log_prob"]).abs().max()),
            "window_grad": float((one["grad"] - split["grad"]).abs().max()),
            "window_grad_scale": float(one["grad"].abs().max())}


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sp2_equals_one_rank_in_log_probs_entropy_loss_values_and_gradients(tmp_path):
    run_ranks(_rank_main, (str(tmp_path / "pg"), str(tmp_path)), SP)
    for rank in range(SP):
        got = dict(np.load(tmp_path / f"rank{rank}.npz"))
        for kv in (2, 1):
            for key in ("log_prob", "entropy", "loss"):
                assert got[f"kv{kv}_{key}"] < TOL, (rank, kv, key, got[f"kv{kv}_{key}"])
            assert got[f"kv{kv}_grad"] < TOL * max(1.0, got[f"kv{kv}_grad_scale"]), (rank, kv, got)
        assert got["values"] < TOL * max(1.0, got["values_scale"]), got
        assert got["lora_log_prob"] < TOL and got["lora_grad"] < TOL * max(1.0, got["lora_grad_scale"]), got
        assert got["gc_log_prob"] < TOL and got["gc_grad"] < TOL * max(1.0, got["gc_grad_scale"]), got
        assert got["bf16_sp_error"] < 2 * got["bf16_one_error"] + 1e-3, got   # no error beyond bf16's own
        assert got["wrong_mask_log_prob"] > 1e-2, got   # the parity above can fail
        assert got["window_log_prob"] < TOL, got
        assert got["window_grad"] < TOL * max(1.0, got["window_grad_scale"]), got


def test_sequence_lengths_of_a_packed_row():
    assert ulysses.sequence_lengths(torch.tensor([0, 1, 2, 0, 1, 0])) == [3, 2, 1]
    assert ulysses.sequence_lengths(torch.tensor([0, 1, 2, 3])) == [4]


@pytest.mark.parametrize("heads,kv,size,ok", [(4, 2, 2, True), (4, 1, 2, True), (4, 4, 4, True), (6, 3, 2, False),
                                              (6, 2, 3, False), (4, 2, 4, True), (8, 2, 4, True), (4, 4, 8, False)])
def test_head_problem_says_which_head_counts_split(heads, kv, size, ok):
    problem = ulysses.head_problem(heads, kv, size)
    assert (problem is None) == ok, problem


def _gemma3(window: int = 3, softcap: float | None = 2.0):
    """A Gemma 3 text model whose window (3 tokens) the ragged batch's sequences pass, with
    soft-capped attention logits, in eager attention: transformers' own masks are the reference."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=window,
                              layer_types=["sliding_attention", "full_attention"], attn_logit_softcapping=softcap,
                              max_position_embeddings=64, attn_implementation="eager")
    return Gemma3ForCausalLM(config).float()


def test_packed_attention_keeps_the_sliding_window_and_softcap_of_each_sequence():
    """The per-sequence attention Ulysses runs after its all-to-all, on one packed row, against
    transformers' eager attention of the same sequences one by one (no process group: sp's
    exchange is tested above). Plain causal attention, what sp ran before, must differ."""
    from transformers import AttentionInterface

    lengths = [9, 2, 6]
    model = _gemma3().eval()
    ids = torch.randint(0, 300, (1, sum(lengths)), generator=torch.Generator().manual_seed(1))
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    with torch.no_grad():
        reference = torch.cat([model(input_ids=part).logits for part in ids.split(lengths, 1)], dim=1)

    def packed(plain: bool):
        def attention(module, query, key, value, attention_mask=None, scaling=None, dropout=0.0,
                      sliding_window=None, softcap=None, **kwargs):
            groups = query.shape[1] // key.shape[1]
            k, v = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
            window, cap = (None, None) if plain else (sliding_window, softcap)
            out = ulysses.packed_attention(query, k, v, lengths, scaling=scaling, sliding_window=window, softcap=cap)
            return out.transpose(1, 2).contiguous(), None

        AttentionInterface.register("rlctl_test_packed", attention)
        model.config._attn_implementation = "rlctl_test_packed"
        try:
            with torch.no_grad():
                return model(input_ids=ids, position_ids=positions).logits
        finally:
            model.config._attn_implementation = "eager"

    assert (packed(plain=False) - reference).abs().max() < 1e-5
    assert (packed(plain=True) - reference).abs().max() > 1e-3   # the window and the cap bite here


def test_attention_variants_sp_does_not_implement_are_refused_by_name():
    assert ulysses.unsupported_attention({"sliding_window": 4, "softcap": 50.0, "position_ids": None}) is None
    assert ulysses.unsupported_attention({"s_aux": torch.zeros(2)}) == "s_aux"
    assert ulysses.unsupported_attention({"is_causal": False}) == "is_causal=False"
    assert ulysses.attention_variant_problem("gemma3_text") is None
    assert "s_aux" in ulysses.attention_variant_problem("gpt_oss")
    assert ulysses.attention_variant_problem("falcon", {"alibi": False}) is None
    assert "alibi" in ulysses.attention_variant_problem("bloom", {})


def test_a_model_with_attention_sinks_is_refused_when_its_sp_group_is_built():
    from transformers import GptOssConfig, GptOssForCausalLM

    from rlctl.errors import ConfigError

    config = GptOssConfig(vocab_size=100, hidden_size=32, intermediate_size=32, num_hidden_layers=1,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=2,
                          num_experts_per_tok=1)
    with pytest.raises(ConfigError, match="attention sinks are not implemented"):
        ulysses.build_group(2, GptOssForCausalLM(config), world=2)   # refused before any process group


@pytest.mark.parametrize("window,softcap", [(5, None), (5, 3.0), (None, 3.0), (40, None)])
def test_packed_attention_in_query_blocks_equals_one_masked_call(window, softcap, monkeypatch):
    """Blocks of queries against the keys each can see give the attention of one [L, L] mask
    (block 4 here, so the blocks, the window and the sequence edges all cross)."""
    gen = torch.Generator().manual_seed(2)
    lengths = [11, 3, 9]
    q, k, v = (torch.randn(1, 2, sum(lengths), 8, generator=gen) for _ in range(3))
    whole = ulysses.packed_attention(q, k, v, lengths, sliding_window=window, softcap=softcap)
    monkeypatch.setattr(ulysses, "QUERY_BLOCK", 4)
    blocked = ulysses.packed_attention(q, k, v, lengths, sliding_window=window, softcap=softcap)
    torch.testing.assert_close(blocked, whole, rtol=1e-6, atol=1e-6)
