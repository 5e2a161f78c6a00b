"""The model the rollout tests share (also loaded inside spawned FSDP ranks, hence a module)."""

from __future__ import annotations

import torch

PAD, EOS = 259, [258, 256]  # rlctl.models.tiny: <|pad|>, <|im_end|>, <|endoftext|>
NEVER = [-1]  # an EOS id no model can emit: every row runs to max_new_tokens


def load_context_sensitive_model(model_dir):
    """The tiny test model in float64, with its layer matrices scaled up.

    Float64: a random tiny model has near-tied logits; in float32 two correct implementations
    may round a tie differently, in float64 they cannot. At init scale (std 0.02) it ignores its
    context and repeats one token, which would let a broken KV cache pass; larger layer weights
    make every token depend on the context.
    """
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".layers." in name and p.dim() == 2:
                p.mul_(8.0)
    return model


def prompt_batch(lengths=(9, 14, 4), seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (length,), generator=gen).tolist() for length in lengths]
