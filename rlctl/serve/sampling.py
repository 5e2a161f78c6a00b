"""Per-row next-token sampling for a batch whose rows belong to different requests.

Every row carries its own temperature, top_p, top_k and (optionally) its own seeded generator,
so one decode step can serve a greedy request next to a creative one, and a seeded request
gets the same tokens whoever else shares the batch.
"""

from __future__ import annotations

import torch


def filter_logits(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                  top_k: torch.Tensor) -> torch.Tensor:
    """Temperature-scale and top-k/top-p-mask logits [B, V] row by row (-inf = never sampled).

    temperature [B] (> 0 here; greedy rows are handled by the caller), top_p [B] in (0, 1],
    top_k [B] long (0 = off). Nucleus keeps the smallest prefix of the sorted distribution
    whose mass reaches top_p: a token is dropped when the mass *before* it already does.
    """
    scaled = logits.float() / temperature.clamp_min(1e-6).unsqueeze(1)
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    vocab = scaled.shape[-1]
    rank = torch.arange(vocab, device=scaled.device).unsqueeze(0)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).unsqueeze(1)
    drop = rank >= k
    probs = sorted_logits.masked_fill(drop, float("-inf")).softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    drop |= mass_before >= top_p.unsqueeze(1)
    drop[:, 0] = False  # the most likely token always survives
    sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(scaled, float("-inf")).scatter(1, order, sorted_logits)


def sample_next_tokens(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                       top_k: torch.Tensor, generators: list[torch.Generator | None],
                       default_generator: torch.Generator | None = None) -> torch.Tensor:
    """Next token ids [B] from logits [B, V]; rows with temperature 0 are greedy.

    Sampling uses the exponential race: argmax_i p_i / E_i with E_i ~ Exp(1) draws i with
    probability p_i. The noise of a seeded row comes from that row's own generator, so its
    draw does not depend on batch size or position; unseeded rows share `default_generator`.
    """
    greedy = temperature <= 0
    tokens = logits.argmax(dim=-1)
    if bool(greedy.all()):
        return tokens
    probs = filter_logits(logits, temperature, top_p, top_k).softmax(dim=-1)
    noise = torch.empty_like(probs)
    shared = [i for i, g in enumerate(generators) if g is None]
    if shared:
        noise[shared] = torch.empty((len(shared), probs.shape[1]), device=probs.device).exponential_(
            generator=default_generator)
    for i, g in enumerate(generators):
        if g is not None:
            noise[i].exponential_(generator=g)
    sampled = (probs / noise).argmax(dim=-1)
    return torch.where(greedy, tokens, sampled)
