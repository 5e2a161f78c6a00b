"""token_log_probs (row chunks, one float32 chunk at a time) computes what the plain formulation does,
forward and backward: log-probs, entropy and its gradient, at a temperature, with -inf logits."""

from __future__ import annotations

import pytest
import torch

from rlctl.algorithms import entropy_from_logits, log_probs_from_logits
from rlctl.workers.compute import vocab_logprob
from rlctl.workers.compute.vocab_logprob import token_log_probs


def plain(logits, labels, temperature):
    z = logits.float() / temperature
    return log_probs_from_logits(z, labels), entropy_from_logits(z)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("entropy_grad", [False, True])
def test_equals_the_plain_formulation_forward_and_backward(monkeypatch, temperature, entropy_grad):
    monkeypatch.setattr(vocab_logprob, "CHUNK_VALUES", 3 * 50)      # 3 rows a chunk: 11 rows -> 4 chunks
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(11, 50, generator=g) * 3
    logits[2, 7:20] = float("-inf")                                 # banned tokens (a VLM's placeholders)
    labels = torch.randint(0, 7, (11,), generator=g)
    weights, bonus = torch.randn(11, generator=g), torch.randn(11, generator=g)
    results = []
    for fn in (plain, lambda x, y, t: token_log_probs(x, y, temperature=t, with_entropy=True,
                                                      entropy_grad=entropy_grad)):
        x = logits.clone().requires_grad_()
        log_prob, entropy = fn(x, labels, temperature)
        loss = (weights * log_prob).sum() + ((bonus * entropy).sum() if entropy_grad else 0)
        loss.backward()
        results.append((log_prob.detach(), entropy.detach(), x.grad))
    (want_lp, want_h, want_grad), (got_lp, got_h, got_grad) = results
    assert torch.allclose(got_lp, want_lp, atol=1e-5) and torch.allclose(got_h, want_h, atol=1e-5)
    assert torch.isfinite(got_grad).all() and (got_grad[2, 7:20] == 0).all()
    # the plain entropy's gradient is NaN on a row with -inf logits (0 * -inf in its backward): compare the others
    finite = torch.isfinite(want_grad).all(-1)
    assert finite.sum() >= 10 and torch.allclose(got_grad[finite], want_grad[finite], atol=1e-5)


def test_half_precision_logits_give_float32_outputs_and_a_gradient_of_their_dtype():
    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(5, 40, generator=g) * 2).bfloat16().requires_grad_()
    labels = torch.randint(0, 40, (5,), generator=g)
    log_prob, entropy = token_log_probs(logits, labels)
    assert entropy is None and log_prob.dtype == torch.float32
    want, _ = plain(logits.detach(), labels, 1.0)
    assert torch.allclose(log_prob, want, atol=1e-6)               # upcast first, as the plain way does
    log_prob.sum().backward()
    assert logits.grad.dtype == torch.bfloat16 and (logits.grad.float().sum(-1).abs() < 0.05).all()
