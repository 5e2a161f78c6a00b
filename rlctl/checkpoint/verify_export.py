"""Logits checks that make `rlctl merge` trustworthy: the written folder must compute what was trained.

Three sets of float32 logits on a few fixed prompts (CPU, one prompt at a time, no padding; a
vision-language model also gets a chat prompt with a fixed image, so the vision tower is checked):
    trained   the model rebuilt from the checkpoint (LoRA adapters unmerged)
    expected  the model about to be written, with its weights rounded to the export dtype
    written   the folder loaded back with from_pretrained (+ PeftModel for an adapter folder)
Checks, with scale = max(1, max |trained logits|):
    merge:   |expected - trained| <= 1e-4 x scale in float32 (before rounding): the LoRA merge
             (alpha / r scaling) or the copy of the weights changed nothing
    written: |written - expected| <= 1e-4 x scale: the files hold exactly those weights (names,
             tied embeddings, shards, adapter r/alpha), whatever the dtype
`max |written - trained|` is reported too: 0-ish in float32, the rounding of bf16/fp16 otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from rlctl.errors import CheckpointError
from rlctl.models.anatomy import causal_lm_parts

TOLERANCE = 1e-4
PROMPTS = ("The capital of France is", "def fibonacci(n):\n    ", "12 * 7 = 84. 84 + 16 =")
CHAT = [{"role": "user", "content": "What is 3 + 4? Answer with a number."}]
MAX_TOKENS = 48


def prompt_ids(tokenizer) -> list[list[int]]:
    """Token ids of the fixed prompts, plus one rendered with the chat template when there is one."""
    prompts = [tokenizer(text, add_special_tokens=True)["input_ids"][:MAX_TOKENS] for text in PROMPTS]
    if getattr(tokenizer, "chat_template", None):
        chat = tokenizer.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=True)
        if hasattr(chat, "keys"):  # transformers 5 returns a BatchEncoding
            chat = chat["input_ids"]
        prompts.append(list(chat)[:MAX_TOKENS])
    return [p for p in prompts if p]


def vision_prompts(processor) -> list[dict]:
    """One chat prompt with a fixed 56x84 image (colour gradients: every patch differs), as the
    model's forward takes it (rlctl.models.vision.encode_prompt)."""
    import numpy as np
    from PIL import Image

    from rlctl.models.vision import encode_prompt

    y, x = np.mgrid[0:56, 0:84]
    pixels = np.stack([x * 3, y * 4, (x + y) * 2], axis=-1).astype(np.uint8)
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is in the picture?"}]}]
    return [encode_prompt(processor, messages, [Image.fromarray(pixels, "RGB")])]


def _forward(model: torch.nn.Module, prompt) -> torch.Tensor:
    if not isinstance(prompt, dict):
        return model(input_ids=torch.tensor([prompt])).logits[0]
    # the image prompt: with mm_token_type_ids (else silently 1-D positions) and no cached rope deltas
    causal_lm_parts(model).model.rope_deltas = None
    inputs = {k: torch.as_tensor(v)[None] if k in ("input_ids", "mm_token_type_ids") else torch.as_tensor(v)
              for k, v in prompt.items()}
    return model(**inputs).logits[0]


@torch.no_grad()
def logits_of(model: torch.nn.Module, prompts: list) -> list[torch.Tensor]:
    """float32 logits [len(prompt), vocab] per prompt (token ids, or vision_prompts' dicts)."""
    model.eval()
    return [_forward(model, prompt).float() for prompt in prompts]


def max_abs_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    if [t.shape for t in a] != [t.shape for t in b]:
        return float("inf")
    return max(float((x - y).abs().max()) for x, y in zip(a, b))


def scale_of(logits: list[torch.Tensor]) -> float:
    return max(1.0, max(float(t.abs().max()) for t in logits))


@dataclass(frozen=True)
class Verification:
    merge_diff: float       # expected (float32, before rounding) vs trained
    written_diff: float     # written folder vs expected (rounded to the export dtype)
    trained_diff: float     # written folder vs trained: what a user of the folder sees
    tolerance: float        # TOLERANCE x scale: the bound merge_diff and written_diff must meet

    def as_dict(self) -> dict:
        return {"merge_max_abs_diff": self.merge_diff, "written_max_abs_diff": self.written_diff,
                "trained_max_abs_diff": self.trained_diff, "tolerance": self.tolerance}


def check(what: str, diff: float, tolerance: float) -> None:
    if not diff <= tolerance:  # NaN fails too
        raise CheckpointError(f"merge verification failed: {what} max |logit diff| {diff:.3g} > {tolerance:.3g}",
                              hint="the export does not reproduce the trained model; nothing was written. "
                                   "Please report this with RLCTL_DEBUG=1 output")


def load_written(folder: Path, *, adapter: bool, base_path: str, trust_remote_code: bool) -> torch.nn.Module:
    """The written folder as a user would load it, in float32 on CPU (a vision-language model
    through AutoModelForImageTextToText, the class that holds its vision tower)."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from rlctl.models.vision import is_vision_model

    vision = is_vision_model(folder) or is_vision_model(base_path)
    auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM

    try:
        if not adapter:
            return auto.from_pretrained(folder, dtype=torch.float32, trust_remote_code=trust_remote_code)
        from peft import PeftModel

        from rlctl.workers.compute.lora import quiet_moe_patterns

        base = auto.from_pretrained(base_path, dtype=torch.float32, trust_remote_code=trust_remote_code)
        with quiet_moe_patterns():
            return PeftModel.from_pretrained(base, folder)
    except Exception as err:  # noqa: BLE001 - a folder that does not load is a failed export
        raise CheckpointError(f"merge verification failed: the written folder does not load ({type(err).__name__}: "
                              f"{str(err).splitlines()[0][:200]})", hint="nothing was written") from None
