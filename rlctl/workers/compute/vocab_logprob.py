"""Log-probs and entropy of sampled tokens over a large vocabulary, a few rows at a time.

A real model's vocabulary is large (SmolLM2: 49,152): for the ~2,000 response tokens of a
micro-batch, one float32 copy of the logits is ~400 MB, and the plain formulation (upcast, divide
by the temperature, logsumexp, a softmax for the entropy, autograd keeping several of them for
backward) writes a handful of such tensors per micro-batch. On a CPU that memory traffic, and the
page faults of freshly allocated buffers that size, cost as much as the LM head's matmul.
`token_log_probs` reads the logits in the model's dtype once per pass, row chunk by row chunk in
float32 buffers of a few MB, keeps only the per-row log-normaliser for backward and writes the
gradient straight into one tensor of the logits' dtype. The math is the plain one:
log p(label) = z_label - logsumexp(z), H = logsumexp(z) - sum_v p_v z_v (terms with p_v = 0
dropped, so -inf logits give 0), z = logits / T.
"""

from __future__ import annotations

import torch

CHUNK_VALUES = 1 << 21       # float32 values per chunk on CPU (8 MiB): buffers that size are reused, not faulted in
GPU_CHUNK_VALUES = 1 << 26   # on a GPU (256 MiB): fewer, larger kernels; its allocator keeps the memory anyway


def token_log_probs(logits: torch.Tensor, labels: torch.Tensor, *, temperature: float = 1.0,
                    with_entropy: bool = False, entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(log softmax(logits / T)[labels], entropy of softmax(logits / T) or None), both [M] float32,
    from logits [M, V] of any float dtype and labels [M]. The entropy carries a gradient only with
    `entropy_grad` (an entropy bonus)."""
    log_prob, entropy = _VocabLogProbs.apply(logits, labels.long(), float(temperature or 1.0), with_entropy,
                                             with_entropy and entropy_grad)
    return log_prob, (entropy if with_entropy else None)


def _chunks(logits: torch.Tensor):
    rows, vocab = logits.shape
    step = max(1, (CHUNK_VALUES if logits.device.type == "cpu" else GPU_CHUNK_VALUES) // max(1, vocab))
    return ((lo, min(lo + step, rows)) for lo in range(0, rows, step))


def _scaled(chunk: torch.Tensor, temperature: float) -> torch.Tensor:
    """z = chunk / T in float32 (a new tensor: callers may write into it)."""
    z = chunk.float()
    if temperature != 1.0:
        return z / temperature
    return z.clone() if z is chunk else z


def _p_times(p: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """p * x with 0 where p is 0 (x may be -inf there)."""
    return torch.where(p > 0, p * x, torch.zeros((), dtype=p.dtype, device=p.device))


class _VocabLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels, temperature, with_entropy, entropy_grad):
        log_z = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        picked = torch.empty_like(log_z)
        entropy = torch.empty_like(log_z) if with_entropy else log_z.new_zeros(0)
        for lo, hi in _chunks(logits):
            z = _scaled(logits[lo:hi], temperature)
            log_z[lo:hi] = torch.logsumexp(z, dim=-1)
            picked[lo:hi] = z.gather(-1, labels[lo:hi, None]).squeeze(-1)
            if with_entropy:
                p = (z - log_z[lo:hi, None]).exp_()
                entropy[lo:hi] = log_z[lo:hi] - _p_times(p, z).sum(-1)
        ctx.save_for_backward(logits, labels, log_z, entropy)
        ctx.temperature, ctx.entropy_grad = temperature, entropy_grad
        if not entropy_grad:
            ctx.mark_non_differentiable(entropy)
        return picked - log_z, entropy

    @staticmethod
    def backward(ctx, grad_log_prob, grad_entropy):
        """d/dz of sum_r g_r log p_r(label_r) + e_r H_r: g (onehot - p) - e p (log p + H), then / T."""
        logits, labels, log_z, entropy = ctx.saved_tensors
        grad = torch.empty_like(logits)
        if grad_log_prob is None:
            grad_log_prob = torch.zeros_like(log_z)
        with_entropy = ctx.entropy_grad and grad_entropy is not None
        for lo, hi in _chunks(logits):
            log_p = _scaled(logits[lo:hi], ctx.temperature).sub_(log_z[lo:hi, None])
            p = log_p.exp()
            g = p * -grad_log_prob[lo:hi, None]
            if with_entropy:
                g -= _p_times(p, log_p + entropy[lo:hi, None]) * grad_entropy[lo:hi, None]
            g.scatter_add_(-1, labels[lo:hi, None], grad_log_prob[lo:hi, None])
            if ctx.temperature != 1.0:
                g /= ctx.temperature
            grad[lo:hi] = g
        return grad, None, None, None, None
