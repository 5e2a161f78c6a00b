"""Next-token sampling with per-row temperature / top-p / top-k, shared by the hf rollout engine
and the built-in OpenAI-compatible server (each request row may carry its own parameters).

Sampling inverts each row's CDF: one u ~ U[0, 1) per row from the caller's torch.Generator, and
the first token whose cumulative softmax(logits / T) mass exceeds u x the total, which is exactly a
draw from softmax(logits / T). It needs no sort and one random number per row (Gumbel-max needs
one per vocabulary entry: at 32 rows x 49,152 tokens drawing those took longer than the rest of
the sampling), and the same generator state always gives the same tokens.
"""

from __future__ import annotations

import torch

Scalar = float | int
RowParam = torch.Tensor | Scalar


def _per_row(value: RowParam, rows: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A scalar or a [rows] tensor -> a [rows] tensor on `device`."""
    if isinstance(value, torch.Tensor):
        return value.to(device=device, dtype=dtype).reshape(rows)
    return torch.full((rows,), value, dtype=dtype, device=device)


def apply_top_k(logits: torch.Tensor, top_k: torch.Tensor) -> torch.Tensor:
    """Keep the k largest logits of each row (k = top_k[row], 0 = keep all), -inf elsewhere.

    One topk with the largest k of the batch; the row's k-th value is its threshold (ties at the
    threshold are kept, as in HF's TopKLogitsWarper). logits [B, V], top_k [B] int.
    """
    vocab = logits.shape[-1]
    k = torch.where(top_k <= 0, vocab, top_k.clamp(max=vocab))
    if bool((k >= vocab).all()):
        return logits
    k_max = int(k.max())
    kth = torch.topk(logits, k_max, dim=-1).values.gather(-1, (k - 1).clamp(max=k_max - 1).unsqueeze(-1))
    kth = torch.where((k >= vocab).unsqueeze(-1), torch.full_like(kth, float("-inf")), kth)
    return logits.masked_fill(logits < kth, float("-inf"))


def apply_top_p(logits: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Nucleus filter: keep the smallest set of top tokens whose probability reaches top_p[row].

    Sorted descending, a token is dropped when the mass of the tokens before it already reaches
    p (so the top token always stays). logits [B, V] (already divided by T), top_p [B] in (0, 1].
    """
    sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    mass_before = torch.cumsum(probs, dim=-1) - probs
    drop_sorted = mass_before >= top_p.unsqueeze(-1)
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return logits.masked_fill(drop, float("-inf"))


def uniforms(rows: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """u ~ U[0, 1) [rows], drawn on the generator's device (CPU generators stay usable for GPU
    logits) so that one generator state gives one stream of tokens everywhere."""
    gen_device = generator.device if generator is not None else torch.device("cpu")
    return torch.rand(rows, generator=generator, device=gen_device, dtype=torch.float32).to(device)


def scaled_logits(logits: torch.Tensor, temperature: torch.Tensor, greedy: torch.Tensor) -> torch.Tensor:
    """logits [B, V] / temperature [B] as a new float32 tensor (rows where `greedy` divided by 1),
    for draw to overwrite. At a decode step's [32 x 49,152] a full-size temporary costs more than
    the arithmetic (fresh pages), so this is the one it takes; T = 1 everywhere divides nothing."""
    scaled = logits.to(torch.float32, copy=True)
    divisor = torch.where(greedy, 1.0, temperature)
    if not bool((divisor == 1).all()):
        scaled.div_(divisor.unsqueeze(-1))
    return scaled


def draw(scaled: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Token ids [B] drawn from softmax(scaled [B, V]) by inverting each row's CDF at u [B]: the
    first token whose cumulative mass is above u x the row's total. A filtered (-inf) token adds
    no mass, so it is never the first above, and a u within rounding of the total takes the last
    token that has mass. `scaled` is overwritten (it becomes the unnormalised CDF)."""
    cdf = scaled.sub_(scaled.amax(-1, keepdim=True)).exp_().cumsum_(-1)   # [B, V], unnormalised
    picked = torch.searchsorted(cdf, (u.unsqueeze(-1) * cdf[:, -1:]).contiguous(), right=True).squeeze(-1)
    if bool((picked < cdf.shape[-1]).all()):
        return picked
    last = (cdf < cdf[:, -1:]).sum(-1)   # the last token with mass: where the CDF reaches its total
    return torch.minimum(picked, last)


def sample_tokens(logits: torch.Tensor, *, temperature: RowParam = 1.0, top_p: RowParam = 1.0,
                  top_k: RowParam = 0, generator: torch.Generator | None = None) -> torch.Tensor:
    """One next token per row from logits [B, V]; returns int64 [B].

    Per row: temperature 0 -> argmax; otherwise softmax(logits / T) filtered by top-k then top-p
    (HF's order). Scalars apply to every row; tensors give one value per row. Unless every row is
    greedy, a uniform is drawn for every row, so the generator advances the same whatever the mix.
    """
    rows, device = logits.shape[0], logits.device
    temp = _per_row(temperature, rows, torch.float32, device)
    greedy = temp <= 0
    if bool(greedy.all()):
        return logits.argmax(dim=-1)
    u = uniforms(rows, generator, device)
    scaled = scaled_logits(logits, temp, greedy)
    k = _per_row(top_k, rows, torch.int64, device)
    if bool((k > 0).any()):
        scaled = apply_top_k(scaled, k)
    p = _per_row(top_p, rows, torch.float32, device)
    if bool((p < 1).any()):
        scaled = apply_top_p(scaled, p)
    sampled = draw(scaled, u)
    return torch.where(greedy, logits.argmax(dim=-1), sampled) if bool(greedy.any()) else sampled
