"""The running decode batch of continuous batching, on the training rollout's runners.

The KV cache and the decode step are rlctl.workers.rollout.decoder's (`make_runner`: the packed
DecoderRunner for Llama-style models, HF forward otherwise), the very code the hf rollout engine
samples with. What continuous batching adds is here: rows join (`admit`: their prompts prefilled,
then merged with the running rows through the runner's rows_state / load_rows, each choice of a
request a copy of its prompt's row) and leave (`keep`) between steps, and each row's next RoPE
position is tracked (its real tokens so far, so padding never shifts it).
"""

from __future__ import annotations

import torch

# generated tokens a DecoderRunner holds before the rows' KV is regrouped into prompts (a copy of
# the cache every this many steps at most; admissions regroup anyway)
ROOM = 128


class LiveBatch:
    """The rows being decoded together (row order = the caller's order)."""

    def __init__(self, model, *, pad_id: int, context_length: int, rows_hint: int, pack: bool = True,
                 vision: bool = False, fast: bool = True, room: int = ROOM):
        from rlctl.workers.rollout.decoder import make_runner

        self.model, self.pad_id = model, pad_id
        self.runner = make_runner(model, room, context_length, fast=fast, vision=vision, rows_hint=rows_hint,
                                  pack=pack)
        self.positions: torch.Tensor | None = None   # [A] long: the position of each row's next token

    @property
    def size(self) -> int:
        return 0 if self.positions is None else int(self.positions.shape[0])

    @torch.inference_mode()
    def admit(self, prompts: list[list[int]], copies: list[int], visions: list | None = None) -> torch.Tensor:
        """Prefill `prompts` (left padded, in one forward) and append row copies[j] = a copy of
        prompt copies[j] after the running rows; returns the new rows' next-token logits [len(copies), V].
        `visions`: per prompt None or its image arrays (rlctl.api.vision, vision-language models)."""
        from rlctl.workers.rollout.decoder import left_pad

        device = self.model.device
        running = self.runner.rows_state(torch.arange(self.size, device=device)) if self.size else None
        input_ids, valid = left_pad(prompts, self.pad_id, device)
        vision = _vision(self.model, input_ids, valid, visions)
        logits = self.runner.prefill(input_ids, valid, 1, **({"vision": vision} if vision else {}))
        rows = torch.tensor(copies, dtype=torch.long, device=device)
        if running is not None or copies != list(range(len(prompts))):
            self.runner.load_rows(([running] if running is not None else []) + [self.runner.rows_state(rows)])
        lengths = valid.sum(-1)[rows]
        self.positions = lengths if self.positions is None else torch.cat([self.positions, lengths])
        return logits[rows]

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row [A]; returns next-token logits [A, V]."""
        if self.runner.wants_regroup():
            self.runner.load_rows([self.runner.rows_state(torch.arange(self.size, device=self.model.device))])
        logits = self.runner.decode(tokens.to(self.model.device), self.positions)
        self.positions = self.positions + 1
        return logits

    def clear(self) -> None:
        """No rows (the next admit prefills afresh; the runner keeps its packed weights)."""
        self.positions = None

    @torch.inference_mode()
    def keep(self, rows: list[int]) -> None:
        """Keep only `rows`, ascending (the rows that did not finish, in order)."""
        index = torch.tensor(rows, dtype=torch.long, device=self.model.device)
        self.runner.select(index)
        self.positions = self.positions[index]


def _vision(model, input_ids: torch.Tensor, valid: torch.Tensor, visions: list | None) -> dict | None:
    """The runner's `vision` for a prefill whose rows may carry images: the forward's image
    inputs, M-RoPE positions and deltas [B]; None when no row has an image."""
    if not visions or not any(v is not None and "pixel_values" in v for v in visions):
        return None
    from rlctl.api.vision import vision_inputs

    images, deltas = vision_inputs(model, input_ids, valid.long(), visions)
    return {**images, "deltas": deltas.view(-1)}
