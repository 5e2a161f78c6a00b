"""`rlctl model tiny`: a deterministic, random-initialised model (Qwen2 by default), built fully offline.

Tests, CI and the demo need a real Hugging Face model folder without a hub. The tokenizer is
byte-level (one token per UTF-8 byte, ids 0..255) plus four special tokens, with a ChatML chat
template, so `apply_chat_template` and round-trip decoding work like a real chat model's. Its tools
block is compact (one line per tool), since every byte of it is a token the model must attend across.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rlctl.models.chat_templates import BYTE_CHAT_TEMPLATE

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")


def _byte_alphabet() -> dict[int, str]:
    """The reversible byte -> printable character map that byte-level BPE tokenizers use."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table, extra = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return table


def build_tokenizer(max_length: int = 2048):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: b for b, ch in _byte_alphabet().items()}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.add_special_tokens(list(SPECIAL_TOKENS))  # ids 256..259
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|pad|>", bos_token=None,
        unk_token=None, additional_special_tokens=["<|endoftext|>", "<|im_start|>"],
        model_max_length=max_length, padding_side="left", clean_up_tokenization_spaces=False,
    )
    tok.chat_template = BYTE_CHAT_TEMPLATE
    return tok


# arch -> (config class, model class, extra config keys): other layer layouts for tests of code
# that must not assume Qwen2's names (LoRA targets: Phi-3 fuses qkv_proj and gate_up_proj; the
# MoE models keep their experts in 3-D weight banks with a router).
ARCHS = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}),
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", {"sliding_window": 64}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", {"num_experts": 4, "num_experts_per_tok": 2}),
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", {"num_local_experts": 4, "num_experts_per_tok": 2}),
}


def _tiny_config(arch: str, tok, *, layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int,
                 max_positions: int, **extra):
    """The transformers config of a tiny `arch` model around the tokenizer `tok` (byte-level or Qwen's)."""
    import transformers

    config_class, _, arch_extra = ARCHS[arch]
    extra = {**arch_extra, **extra}
    if arch in ("qwen3", "gemma3", "qwen3_moe"):
        extra["head_dim"] = hidden // heads
    if arch == "qwen3_moe":
        extra["moe_intermediate_size"] = intermediate // 2
    return getattr(transformers, config_class)(
        hidden_size=hidden, num_attention_heads=heads, intermediate_size=intermediate, vocab_size=len(tok),
        num_hidden_layers=layers, num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
        rope_theta=10000.0, rms_norm_eps=1e-6, initializer_range=0.02, bos_token_id=None,
        eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=tok.pad_token_id, **extra)


def _save_seeded(out, model_class: str, cfg, tok, seed: int, info: dict, generation_config=None) -> dict:
    """Initialise `model_class` from `cfg` under `seed` (float32, CPU: bitwise reproducible), write it,
    the tokenizer and rlctl_tiny.json (`info` plus path, params, vocab, seed) to `out`."""
    import torch
    import transformers

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = getattr(transformers, model_class)(cfg).to(torch.float32)
    if generation_config is not None:
        model.generation_config = generation_config
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    info = {"path": str(out), "params": sum(p.numel() for p in model.parameters()), **info, "vocab": len(tok),
            "seed": seed}
    (out / "rlctl_tiny.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def build_tiny_model(out: str | os.PathLike, *, layers: int = 2, hidden: int = 64, heads: int = 4,
                     kv_heads: int = 2, intermediate: int | None = None, max_positions: int = 2048,
                     tie_embeddings: bool = True, seed: int = 0, arch: str = "qwen2",
                     tokenizer: str = "byte") -> dict:
    """Write a tiny causal LM of `arch` (one of ARCHS) + tokenizer to `out`; returns a summary dict.

    tokenizer: "byte" (the byte-level one here) or "qwen" (Qwen's real BPE vocabulary,
    rlctl.models.qwen_vocab). The same arguments always give bitwise-identical weights (seeded CPU
    init, float32).
    """
    from transformers import GenerationConfig

    if arch not in ARCHS:
        raise ValueError(f"unknown tiny architecture {arch!r}; one of {', '.join(ARCHS)}")
    if tokenizer == "qwen":
        from rlctl.models.qwen_vocab import build_qwen_tokenizer

        tok = build_qwen_tokenizer(max_positions)
    else:
        tok = build_tokenizer(max_positions)
    cfg = _tiny_config(arch, tok, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                       intermediate=intermediate or 4 * hidden, max_positions=max_positions,
                       tie_word_embeddings=tie_embeddings, use_cache=True)
    generation = GenerationConfig(
        eos_token_id=[cfg.eos_token_id, tok.convert_tokens_to_ids("<|endoftext|>")], pad_token_id=tok.pad_token_id,
        bos_token_id=None, do_sample=True, temperature=1.0, top_p=1.0, top_k=0,
    )
    return _save_seeded(out, ARCHS[arch][1], cfg, tok, seed,
                        {"arch": arch, "layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads,
                         "tied_embeddings": tie_embeddings, "tokenizer": tokenizer}, generation)


def build_tiny_reward_model(out: str | os.PathLike, *, layers: int = 2, hidden: int = 64, heads: int = 4,
                            kv_heads: int = 2, max_positions: int = 2048, seed: int = 0) -> dict:
    """Write a tiny random Qwen2ForSequenceClassification (one label: a reward model) + tokenizer.

    The same byte-level tokenizer, chat template and config as build_tiny_model's Qwen2; the
    `score` head is seeded too, so the same arguments give the same rewards."""
    tok = build_tokenizer(max_positions)
    cfg = _tiny_config("qwen2", tok, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
                       intermediate=4 * hidden, max_positions=max_positions, num_labels=1)
    return _save_seeded(out, "Qwen2ForSequenceClassification", cfg, tok, seed,
                        {"layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads, "num_labels": 1,
                         "reward_model": True})
