"""Images in a multi-turn rollout of a vision-language policy: the prompt's and the tools'.

A tool may answer with images (ToolResult.images). Its message then reaches the chat template as
content parts, one {"type": "image"} per image before the text, and the template writes one
placeholder per image (Qwen2.5-VL: `<|vision_start|><|image_pad|><|vision_end|>`). When the
conversation is extended, each image's single `<|image_pad|>` becomes grid.prod() // merge**2
pads (what the processor does to a prompt), and the image's pixel_values / image_grid_thw join the
conversation's, after the prompt's and the earlier tools'. Every later turn's prefill and the
training batch's row then carry all of them, in token order.

The controller holds the processor (`TurnImages`); the policy workers only see the arrays.
"""

from __future__ import annotations

import io

import numpy as np


class TurnImages:
    """model_path's image processor and placeholder token, on the controller."""

    def __init__(self, model_path: str):
        from rlctl.models.vision import cached_processor

        processor = cached_processor(str(model_path))
        self.image_processor = processor.image_processor
        self.merge = int(self.image_processor.merge_size)
        token = getattr(processor, "image_token_id", None)
        self.image_pad = int(token if token is not None else
                             processor.tokenizer.convert_tokens_to_ids(processor.image_token))

    def encode(self, images) -> tuple[np.ndarray, np.ndarray] | None:
        """PIL images (or encoded image bytes) -> pixel_values [patches, D] float32 and
        image_grid_thw [images, 3] int64, as the processor makes them; None for no image."""
        if not images:
            return None
        enc = self.image_processor(images=[_pil(x) for x in images], return_tensors="np")
        return (np.asarray(enc["pixel_values"], dtype=np.float32),
                np.asarray(enc["image_grid_thw"], dtype=np.int64))

    def pads(self, grid: np.ndarray) -> list[int]:
        """Image tokens per image of `grid` [images, 3]: t*h*w patches merged merge x merge."""
        return [int(np.prod(row)) // self.merge ** 2 for row in grid]

    def expand(self, ids: list[int], grid: np.ndarray) -> list[int] | None:
        """ids with its k-th `<|image_pad|>` repeated pads(grid)[k] times; None when ids has not
        exactly one placeholder per image (a template that does not render them)."""
        counts = self.pads(grid)
        if sum(1 for t in ids if t == self.image_pad) != len(counts):
            return None
        out, k = [], 0
        for t in ids:
            if t == self.image_pad:
                out += [t] * counts[k]
                k += 1
            else:
                out.append(t)
        return out


def _pil(image):
    """A PIL image as RGB; encoded bytes (png, jpeg) decoded first."""
    from PIL import Image

    if isinstance(image, (bytes, bytearray)):
        image = Image.open(io.BytesIO(image))
    return image.convert("RGB")


def tool_message(text: str, images: list, role: str = "tool") -> dict:
    """A tool's (or the interaction's user) chat message: its images as content parts before its
    text (plain text without)."""
    if not images:
        return {"role": role, "content": text}
    return {"role": role, "content": [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]}


def stacked(parts: list) -> tuple[np.ndarray, np.ndarray] | tuple[None, None]:
    """A conversation's image parts [(pixel_values, image_grid_thw), ...] as one pair, in order."""
    if not parts:
        return None, None
    return np.concatenate([p for p, _ in parts]), np.concatenate([g for _, g in parts])


def row_positions(positions: np.ndarray, input_width: int, real_input: int, length: int) -> np.ndarray:
    """A turn row's M-RoPE positions [3, W+T] (input left-padded to W) -> its real tokens' [3, L+len]."""
    return positions[:, input_width - real_input:input_width + length]


def batch_positions(convs: list, prompt_width: int, response_width: int) -> np.ndarray:
    """position_ids [B, 3, P+T] of the finished conversations (prompt left-padded to P, response
    right-padded to T) from each one's last turn: that turn's prefill covered every earlier token
    (tool images included) with get_rope_index, its response is text. Padding counts on from the
    last real position (no real token attends to it)."""
    out = np.zeros((len(convs), 3, prompt_width + response_width), dtype=np.int64)
    for r, c in enumerate(convs):
        start, end = prompt_width - len(c.prompt_ids), prompt_width + len(c.response_ids)
        out[r, :, start:end] = c.positions
        out[r, :, end:] = c.positions[:, -1:] + 1 + np.arange(prompt_width + response_width - end)
    return out
