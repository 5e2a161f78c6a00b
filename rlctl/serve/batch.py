"""The running decode batch of continuous batching: a left-padded KV cache rows can join and leave.

Layout: every layer keeps keys/values [B, kv_heads, T, head_dim] in a transformers DynamicCache;
`attention_mask` [B, T] marks real tokens (1) and left padding (0). Row b's next position is
its count of real tokens, so padding never shifts RoPE positions. Joining pads the shorter side
on the left and concatenates along the batch; leaving keeps a subset of rows and trims columns
that are padding in every remaining row.
"""

from __future__ import annotations

import torch

from rlctl.models.loading import cache_of, with_cache


class DecodeBatch:
    """KV cache + padding mask of the rows being decoded together (row order = caller's order)."""

    def __init__(self, cache, attention_mask: torch.Tensor, offsets: torch.Tensor | None = None):
        self.cache = cache
        self.attention_mask = attention_mask  # [B, T] long
        # [B, 1]: added to a row's decode position (a VLM row's M-RoPE delta; 0 for text)
        self.offsets = offsets if offsets is not None else attention_mask.new_zeros((attention_mask.shape[0], 1))

    @property
    def size(self) -> int:
        return int(self.attention_mask.shape[0])

    @classmethod
    @torch.inference_mode()
    def prefill(cls, model, prompts: list[list[int]], pad_id: int,
                visions: list | None = None) -> tuple["DecodeBatch", torch.Tensor]:
        """Run the prompts (left padded) through the model; returns the batch and last logits [B, V].
        `visions`: per prompt None or its image arrays (rlctl.api.vision, vision-language models)."""
        from transformers import DynamicCache

        device = model.device
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for b, p in enumerate(prompts):
            input_ids[b, width - len(p):] = torch.tensor(p, dtype=torch.long)
            mask[b, width - len(p):] = 1
        input_ids, mask = input_ids.to(device), mask.to(device)
        position_ids = (mask.cumsum(-1) - 1).clamp_min(0)
        images, offsets = {}, None
        if visions and any(v is not None and "pixel_values" in v for v in visions):
            from rlctl.api.vision import vision_inputs

            images, offsets = vision_inputs(model, input_ids, mask, visions)
            position_ids = images.pop("position_ids")
        cache = DynamicCache()
        out = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids, **images,
                    **with_cache(model, cache), use_cache=True, logits_to_keep=1)
        return cls(cache_of(out), mask, offsets), out.logits[:, -1, :]

    @torch.inference_mode()
    def decode(self, model, next_tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row [B]; returns next-token logits [B, V]."""
        positions = self.attention_mask.sum(-1, keepdim=True) + self.offsets  # [B, 1]: real tokens so far
        ones = torch.ones((self.size, 1), dtype=self.attention_mask.dtype, device=self.attention_mask.device)
        self.attention_mask = torch.cat([self.attention_mask, ones], dim=1)
        out = model(input_ids=next_tokens.view(-1, 1).to(self.attention_mask.device),
                    attention_mask=self.attention_mask, position_ids=positions,
                    **with_cache(model, self.cache), use_cache=True)
        self.cache = cache_of(out)
        return out.logits[:, -1, :]

    def keep(self, rows: list[int]) -> None:
        """Keep only `rows` (in that order), then drop all-padding leading columns."""
        index = torch.tensor(rows, dtype=torch.long, device=self.attention_mask.device)
        self.attention_mask = self.attention_mask.index_select(0, index)
        self.offsets = self.offsets.index_select(0, index)
        self.cache.batch_select_indices(index)
        real_cols = self.attention_mask.any(dim=0).nonzero()
        start = int(real_cols[0]) if len(real_cols) else self.attention_mask.shape[1]
        if start > 0:
            self.attention_mask = self.attention_mask[:, start:]
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, start:, :], layer.values[:, :, start:, :]

    def extend(self, other: "DecodeBatch") -> None:
        """Append `other`'s rows after this batch's rows (both left padded to a common width)."""
        from transformers import DynamicCache

        width = max(self.attention_mask.shape[1], other.attention_mask.shape[1])
        kv = []
        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            keys = torch.cat([_left_pad(mine.keys, width, 2), _left_pad(theirs.keys, width, 2)], dim=0)
            values = torch.cat([_left_pad(mine.values, width, 2), _left_pad(theirs.values, width, 2)], dim=0)
            kv.append((keys, values))
        self.cache = DynamicCache(ddp_cache_data=kv)
        self.attention_mask = torch.cat([_left_pad(self.attention_mask, width, 1),
                                         _left_pad(other.attention_mask, width, 1)], dim=0)
        self.offsets = torch.cat([self.offsets, other.offsets], dim=0)


def _left_pad(t: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)
