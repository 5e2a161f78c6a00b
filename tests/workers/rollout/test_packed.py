"""Decode-time packed linears (rlctl.workers.rollout.packed): the same function as the modules,
bitwise in bfloat16 and within float32 rounding in float32; LoRA-style layers keep their own
forward; and the fast decoder samples the same tokens packed as unpacked under bf16 autocast."""

from __future__ import annotations

import pytest
import torch
from rollout_models import EOS, PAD, load_context_sensitive_model, prompt_batch

from rlctl.workers.rollout import packed
from rlctl.workers.rollout.hf import HFRolloutEngine

needs_onednn = pytest.mark.skipif(not packed.packing_available(torch.device("cpu"), torch.float32),
                                  reason="this torch has no oneDNN prepacked linear")


@needs_onednn
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_linear_equals_the_modules(dtype):
    torch.manual_seed(0)
    mods = [torch.nn.Linear(48, 64), torch.nn.Linear(48, 16, bias=False), torch.nn.Linear(48, 16)]
    fused = packed.FusedLinear.of(mods, dtype, rows_hint=8)
    assert isinstance(fused, packed.FusedLinear)
    for shape in ((8, 48), (3, 5, 48), (1, 48)):   # decode rows, a prefill batch, one row
        x = torch.randn(*shape)
        got = fused(x)
        for out, m in zip(got, mods):
            want = torch.nn.functional.linear(x.to(dtype), m.weight.to(dtype),
                                              None if m.bias is None else m.bias.to(dtype))
            assert out.dtype == dtype and out.shape == want.shape
            if dtype == torch.bfloat16:
                assert torch.equal(out, want)
            else:
                torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


class Adapter(torch.nn.Linear):   # stands for a LoRA layer: a Linear subclass with its own forward
    def forward(self, x):
        return super().forward(x) + 1.0


def test_layers_that_are_not_plain_linears_keep_their_forward():
    plain, lora = torch.nn.Linear(8, 8), Adapter(8, 8)
    assert packed.FusedLinear.of([plain, lora], torch.float32, 4) is None
    call = packed.linear_or_module([plain, lora], torch.float32, 4)
    x = torch.randn(2, 8)
    assert torch.equal(call(x)[1], lora(x))
    assert packed.linear_or_module([lora], torch.float32, 4) is lora
    assert not packed.packing_available(torch.device("cpu"), torch.float16)


@needs_onednn
def test_fast_decoder_samples_the_same_tokens_packed_and_unpacked(tiny_model_dir, monkeypatch):
    model = load_context_sensitive_model(tiny_model_dir).float()   # autocast casts float32 weights only
    engine = HFRolloutEngine(model, pad_token_id=PAD, eos_token_ids=EOS)

    def sample():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return engine.generate(prompt_batch(), n=3, max_new_tokens=12,
                                   generator=torch.Generator().manual_seed(5))["responses"]

    made = []
    real_of = packed.FusedLinear.of.__func__

    def recording_of(cls, *args, **kwargs):
        made.append(real_of(cls, *args, **kwargs))
        return made[-1]

    monkeypatch.setattr(packed.FusedLinear, "of", classmethod(recording_of))
    with_packing = sample()
    assert made and all(isinstance(f, packed.FusedLinear) for f in made)   # every linear ran packed
    monkeypatch.setattr(packed.FusedLinear, "of", classmethod(lambda cls, *a, **k: None))
    assert (sample() == with_packing).all()
