"""The decode step's attention pieces, shared by DecoderRunner's eager step and its compiled one
(rlctl.workers.rollout.compiled): RoPE in the HF convention, and GQA decode attention over a prompt
cache shared by a prompt's n samples plus each row's own generated keys."""

from __future__ import annotations

import torch


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin (the HF convention: halves, not interleaved pairs)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def decode_attention(q: torch.Tensor, kp: torch.Tensor, vp: torch.Tensor, kg: torch.Tensor, vg: torch.Tensor,
                     bias: torch.Tensor, slot: torch.Tensor | None, n: int, scale: float) -> torch.Tensor:
    """softmax over [prompt keys ++ own generated keys] for q [A, kv, G, D] -> [A, kv, G, D]
    (scores times `scale`: what the projection did not already put into q).

    Prompt part, per prompt: the queries of all its n samples, [B, kv, n*G, D], against its
    keys kp [B, kv, P, D] (bias [B, 1, 1, P] hides the padding) in one matmul, so the prompt cache is
    read once per prompt, not once per sample. Generated part, per row: [A, kv, G, D] against its keys
    kg [A, kv, D, t], values vg [A, kv, t, D]. slot [A]: each live row's original row, None while
    they are still 0..B*n-1 (no scatter into the prompts' layout needed).
    """
    b, (rows, kv, g, d) = kp.shape[0], q.shape
    grouped = q if slot is None else q.new_zeros(b * n, kv, g, d).index_copy_(0, slot, q)
    grouped = grouped.view(b, n, kv, g, d).transpose(1, 2).reshape(b, kv, n * g, d)
    prompt_scores = torch.matmul(grouped, kp.transpose(-1, -2))
    own_scores = torch.matmul(q, kg)
    if scale != 1.0:
        prompt_scores.mul_(scale)
        own_scores.mul_(scale)
    prompt_scores.add_(bias)
    plen = prompt_scores.shape[-1]
    prompt_scores = prompt_scores.view(b, kv, n, g, plen).transpose(1, 2).reshape(b * n, kv, g, plen)
    if slot is not None:
        prompt_scores = prompt_scores[slot]
    probs = torch.softmax(torch.cat([prompt_scores, own_scores], dim=-1), dim=-1)
    prompt_probs = probs[..., :plen]
    if slot is not None:
        prompt_probs = probs.new_zeros(b * n, kv, g, plen).index_copy_(0, slot, prompt_probs)
    prompt_probs = prompt_probs.reshape(b, n, kv, g, plen).transpose(1, 2).reshape(b, kv, n * g, plen)
    prompt_out = torch.matmul(prompt_probs, vp).view(b, kv, n, g, d).transpose(1, 2)
    prompt_out = prompt_out.reshape(b * n, kv, g, d)
    if slot is not None:
        prompt_out = prompt_out[slot]
    return prompt_out + torch.matmul(probs[..., plen:], vg)
