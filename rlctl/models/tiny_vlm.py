"""`rlctl model tiny --arch qwen2_5_vl`: a tiny random Qwen2.5-VL with its processor, fully offline.

The text side is the tiny model's (byte-level tokenizer, ChatML) plus Qwen's vision special tokens;
the vision tower has two blocks. The processor is Qwen2.5-VL's with the PIL image processor (no
torchvision, see rlctl.models.vision) and a chat template that turns an `<image>` marker or an
image content part into `<|vision_start|><|image_pad|><|vision_end|>`; the processor expands
`<|image_pad|>` to one token per 2x2 patch group (a 56x56 image: 4 tokens).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

VLM_ARCHS = ("qwen2_5_vl",)  # `rlctl model tiny --arch` names beside rlctl.models.tiny.ARCHS
VISION_SPECIAL_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
PATCH, MERGE = 14, 2
# The processor's pixel budget: small images keep their size (rounded to 28-pixel cells), larger
# ones are scaled down to at most 16 x 16 patches (64 image tokens).
MIN_PIXELS, MAX_PIXELS = (PATCH * MERGE) ** 2, (16 * PATCH) ** 2


def vision_tokenizer(max_length: int = 2048):
    """The tiny models' byte-level tokenizer plus Qwen2.5-VL's vision tokens (ids 260..263)."""
    from rlctl.models.chat_templates import VISION_CHAT_TEMPLATE
    from rlctl.models.tiny import build_tokenizer

    tok = build_tokenizer(max_length)
    tok.add_special_tokens({"additional_special_tokens": ["<|endoftext|>", "<|im_start|>", *VISION_SPECIAL_TOKENS]})
    tok.chat_template = VISION_CHAT_TEMPLATE
    return tok


def mrope_section(head_dim: int) -> list[int]:
    """M-RoPE splits a head's rotary half into (time, height, width) parts, 16:24:24 in Qwen2.5-VL's
    head_dim 128; the same shares of a smaller head (16 -> [2, 3, 3])."""
    half = head_dim // 2
    t = max(1, half // 4)
    h = (half - t) // 2
    return [t, h, half - t - h]


def _config(tok, *, layers: int, hidden: int, heads: int, kv_heads: int, vision_hidden: int, vision_depth: int,
            max_positions: int):
    from transformers import Qwen2_5_VLConfig

    ids = {name: tok.convert_tokens_to_ids(t) for name, t in (
        ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"),
        ("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"))}
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    text = dict(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
        rms_norm_eps=1e-6, initializer_range=0.02, bos_token_id=None, eos_token_id=eos,
        pad_token_id=tok.pad_token_id, use_cache=True, tie_word_embeddings=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                         "mrope_section": mrope_section(hidden // heads)},
    )
    vision = dict(depth=vision_depth, hidden_size=vision_hidden, intermediate_size=2 * vision_hidden,
                  num_heads=2, out_hidden_size=hidden, patch_size=PATCH, spatial_merge_size=MERGE,
                  temporal_patch_size=2, window_size=112, fullatt_block_indexes=[vision_depth - 1])
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=True, **ids)


def build_processor(tok):
    """Qwen2.5-VL's processor around `tok`, image-only where torchvision is missing."""
    from transformers import Qwen2_5_VLProcessor
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from rlctl.models.vision import image_only, needs_image_only

    sizes = dict(min_pixels=MIN_PIXELS, max_pixels=MAX_PIXELS, patch_size=PATCH, merge_size=MERGE)
    images = Qwen2VLImageProcessorPil(**sizes)
    if needs_image_only(Qwen2_5_VLProcessor):
        return image_only(Qwen2_5_VLProcessor)(image_processor=images, tokenizer=tok, chat_template=tok.chat_template)
    # torchvision is there: the stock processor, whose video processor some transformers versions require
    # (5.17 raises on None); it needs torchvision, so it is imported only here
    from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor

    return Qwen2_5_VLProcessor(image_processor=images, video_processor=Qwen2VLVideoProcessor(**sizes),
                               tokenizer=tok, chat_template=tok.chat_template)


def build_tiny_vlm(out: str | os.PathLike, *, layers: int = 2, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
                   vision_hidden: int = 32, vision_depth: int = 2, max_positions: int = 2048, seed: int = 0) -> dict:
    """Write a tiny random Qwen2_5_VLForConditionalGeneration, its processor (image processor,
    tokenizer, chat template) and rlctl_tiny.json to `out`; returns the summary dict. Seeded CPU
    float32 init: the same arguments give bitwise-identical weights."""
    import torch
    from transformers import GenerationConfig, Qwen2_5_VLForConditionalGeneration

    tok = vision_tokenizer(max_positions)
    cfg = _config(tok, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads, vision_hidden=vision_hidden,
                  vision_depth=vision_depth, max_positions=max_positions)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2_5_VLForConditionalGeneration(cfg).to(torch.float32)
    model.generation_config = GenerationConfig(
        eos_token_id=[tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")], pad_token_id=tok.pad_token_id,
        bos_token_id=None, do_sample=True, temperature=1.0, top_p=1.0, top_k=0)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    build_processor(tok).save_pretrained(out)
    info = {"path": str(out), "params": sum(p.numel() for p in model.parameters()),
            "vision_params": sum(p.numel() for p in model.model.visual.parameters()), "arch": "qwen2_5_vl",
            "layers": layers, "hidden": hidden, "heads": heads, "kv_heads": kv_heads, "vision_hidden": vision_hidden,
            "vision_depth": vision_depth, "tied_embeddings": True, "tokenizer": "byte", "vocab": len(tok),
            "seed": seed, "image_token_id": cfg.image_token_id, "min_pixels": MIN_PIXELS, "max_pixels": MAX_PIXELS}
    (out / "rlctl_tiny.json").write_text(json.dumps(info, indent=1) + "\n")
    return info
