"""The fallback decode runner: any HF causal LM through its own forward with a DynamicCache.

Slower than rlctl.workers.rollout.decoder.DecoderRunner, but always right; same protocol
(prefill, decode, select; rows_state, load_rows, wants_regroup for continuous batching).
"""

from __future__ import annotations

import torch

from rlctl.models.loading import cache_of, with_cache


class HFCacheRunner:
    """Any HF causal LM: its own forward with a DynamicCache (slower, but always right).

    A vision-language model gets `vision` at prefill (rlctl.workers.compute.vision.engine_vision: the
    prompts' M-RoPE positions [3, B, P] and deltas [B], and what its forward takes of the images:
    pixel_values, image_grid_thw, and whatever else a server's processor made); decode then
    places token t of a row at prompt_len + t + delta on all three M-RoPE axes, as the model does."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.cache = None
        self.mask = None
        self.deltas = None   # [rows] M-RoPE offset of each live row (vision models), else None

    def prefill(self, input_ids: torch.Tensor, valid: torch.Tensor, n: int, vision: dict | None = None) -> torch.Tensor:
        from transformers import DynamicCache

        self.cache = DynamicCache()
        mask = valid.long()
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        extra = {}
        if vision is not None:
            positions = vision["position_ids"]
            extra = {k: v for k, v in vision.items() if k not in ("position_ids", "deltas")}   # the images
            self.deltas = vision["deltas"].repeat_interleave(n)
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions,
                         **with_cache(self.model, self.cache), use_cache=True, logits_to_keep=1, **extra)
        self.cache = cache_of(out)
        self.cache.batch_repeat_interleave(n)
        self.mask = mask.repeat_interleave(n, dim=0)
        return out.logits[:, -1]

    def decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=-1)
        positions = positions.unsqueeze(-1)
        if self.deltas is not None:
            positions = (positions + self.deltas.unsqueeze(-1)).unsqueeze(0).expand(3, -1, -1)
        out = self.model(input_ids=tokens.unsqueeze(-1), attention_mask=self.mask,
                         position_ids=positions, **with_cache(self.model, self.cache), use_cache=True)
        self.cache = cache_of(out)
        return out.logits[:, -1]

    def select(self, keep: torch.Tensor) -> None:
        self.cache.batch_select_indices(keep)
        self.mask = self.mask[keep]
        if self.deltas is not None:
            self.deltas = self.deltas[keep]

    def rows_state(self, rows: torch.Tensor) -> tuple[list, torch.Tensor, torch.Tensor | None]:
        """Live rows `rows` (repeats copy a row): per layer (keys, values [R, kv, W, D]), mask [R, W], deltas."""
        kv = [(layer.keys.index_select(0, rows), layer.values.index_select(0, rows)) for layer in self.cache.layers]
        return kv, self.mask[rows], None if self.deltas is None else self.deltas[rows]

    def load_rows(self, states: list[tuple[list, torch.Tensor, torch.Tensor | None]]) -> None:
        """The live rows become those of `states` (rows_state's), in order, left-padded to one
        width, columns that are padding in every row trimmed."""
        from transformers import DynamicCache

        self.mask, start = join_left([s[1] for s in states], 1)
        kv = [tuple(join_left([s[0][i][part] for s in states], 2, start)[0] for part in (0, 1))
              for i in range(len(states[0][0]))]
        self.cache = DynamicCache(ddp_cache_data=kv)
        if any(s[2] is not None for s in states):
            self.deltas = torch.cat([s[2] if s[2] is not None else s[1].new_zeros(s[1].shape[0]) for s in states])
        else:
            self.deltas = None

    def wants_regroup(self) -> bool:
        """Every row's first column is padding (rows left): a regroup trims it."""
        return not bool(self.mask[:, 0].any())


def join_left(parts: list[torch.Tensor], dim: int, start: int | None = None, rows: int = 0) -> tuple[torch.Tensor, int]:
    """Row blocks joined along dim `rows`, each right-aligned along `dim` in the widest's width (zeros
    to its left), from column `start` of that width on; for masks [R, W] (dim 1) start None finds
    it: the first column that is real in any row. Returns the joined tensor and that start. One
    copy of each part into the result (this runs on every admission of a server's requests)."""
    width = max(p.shape[dim] for p in parts)
    if start is None:
        firsts = [width - p.shape[dim] + int(used[0]) for p in parts
                  if len(used := p.bool().any(0).nonzero())]
        start = min(firsts, default=width)
    shape = list(parts[0].shape)
    shape[dim], shape[rows] = width - start, sum(p.shape[rows] for p in parts)
    out = parts[0].new_zeros(shape)
    row = 0
    for p in parts:
        offset = width - p.shape[dim]                  # where the part's column 0 lands
        skip = max(0, start - offset)                  # its columns left of `start`
        cols = p.shape[dim] - skip
        target = out.narrow(rows, row, p.shape[rows]).narrow(dim, shape[dim] - cols, cols)
        target.copy_(p.narrow(dim, skip, cols))
        row += p.shape[rows]
    return out, start
