"""Next-token sampling for a serving batch whose rows belong to different requests.

The filters and the CDF draw are the rollout engine's (rlctl.workers.rollout.token_sampling);
what serving adds is one generator per row: a request with a `seed` draws its uniform from its
own generator, so it gets the same tokens whoever else shares the batch. Unseeded rows share
the server's generator.
"""

from __future__ import annotations

import torch

from rlctl.workers.rollout.token_sampling import apply_top_k, apply_top_p, draw, scaled_logits, uniforms


def sample_next_tokens(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor,
                       top_k: torch.Tensor, generators: list[torch.Generator | None],
                       default_generator: torch.Generator | None = None) -> torch.Tensor:
    """Next token ids [B] from logits [B, V]; rows with temperature 0 are greedy.

    temperature [B], top_p [B] in (0, 1], top_k [B] long (0 = off); generators[b] is row b's own
    generator or None. Sampling draws from softmax(logits / T) (token_sampling.draw), after top-k
    then top-p filtering (HF's order).
    """
    greedy = temperature <= 0
    if bool(greedy.all()):
        return logits.argmax(dim=-1)
    scaled = scaled_logits(logits, temperature, greedy)
    if bool((top_k > 0).any()):
        scaled = apply_top_k(scaled, top_k)
    if bool((top_p < 1).any()):
        scaled = apply_top_p(scaled, top_p)
    u = torch.empty(scaled.shape[0], device=scaled.device)
    shared = [b for b, g in enumerate(generators) if g is None]
    if shared:
        u[shared] = uniforms(len(shared), default_generator, scaled.device)
    for b, g in enumerate(generators):
        if g is not None:
            u[b] = uniforms(1, g, scaled.device)[0]
    sampled = draw(scaled, u)
    return torch.where(greedy, logits.argmax(dim=-1), sampled)
