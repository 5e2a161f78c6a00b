"""Where the parts of a loaded transformers model sit, for the workers' passes and the rollout
engines alike: the HF model under a peft wrapper, whether it has the Llama layout that the fast
paths (the hf engine's DecoderRunner, the shared-prompt and Ulysses passes) drive directly, and its
attention swapped for one of theirs."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Callable, Iterator

if TYPE_CHECKING:
    import torch

LLAMA_TYPES = ("llama", "qwen2", "qwen3", "mistral")


def causal_lm_parts(model: torch.nn.Module) -> torch.nn.Module:
    """The HF model under a peft wrapper (LoRA layers stay in place inside it)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def llama_layout(lm: torch.nn.Module, max_len: int) -> bool:
    """True when `lm` (a causal LM, or its token classifier: the decoder stack at `.model`) has the
    Llama layout (embed_tokens, layers, norm, rotary_emb; full attention; RoPE that does not change
    with the length) and no sliding window shorter than `max_len`."""
    cfg = getattr(lm, "config", None)
    core = getattr(lm, "model", None)
    if cfg is None or core is None or getattr(cfg, "model_type", None) not in LLAMA_TYPES:
        return False
    if not all(hasattr(core, a) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return False
    if any(t != "full_attention" for t in getattr(cfg, "layer_types", None) or ()):
        return False
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if rope.get("rope_type", rope.get("type")) == "dynamic":  # RoPE changes with the length
        return False
    window = getattr(cfg, "sliding_window", None) if getattr(cfg, "use_sliding_window", True) else None
    return window is None or window >= max_len


@contextlib.contextmanager
def attention_as(config, name: str, attention: Callable) -> Iterator[None]:
    """Every attention layer of the model whose config is `config` runs `attention` (a transformers
    attention function, registered as `name`) inside; its own again afterwards."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, attention)
    previous = config._attn_implementation
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = previous
