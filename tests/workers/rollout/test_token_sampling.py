"""Per-row next-token sampling: filters by hand, distributions by counting, determinism."""

from __future__ import annotations

import math

import pytest
import torch

from rlctl.workers.rollout.token_sampling import apply_top_k, apply_top_p, draw, sample_tokens


def test_top_k_keeps_k_largest_per_row():
    logits = torch.tensor([[0.0, 3.0, 1.0, 2.0], [5.0, 4.0, 3.0, 2.0]])
    out = apply_top_k(logits, torch.tensor([2, 0]))
    assert torch.isinf(out[0]).tolist() == [True, False, True, False]
    assert torch.equal(out[1], logits[1])  # k = 0 -> off


def test_top_p_keeps_smallest_prefix_reaching_p():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    # mass before each token (sorted): 0, .5, .8, .95 -> p=0.75 keeps the first two
    assert torch.isinf(apply_top_p(logits, torch.tensor([0.75]))[0]).tolist() == [False, False, True, True]
    # p=0.5: the top token alone reaches it
    assert torch.isinf(apply_top_p(logits, torch.tensor([0.5]))[0]).tolist() == [False, True, True, True]
    assert not torch.isinf(apply_top_p(logits, torch.tensor([1.0]))).any()


def test_per_row_parameters_mix_greedy_and_filtered_rows():
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    gen = torch.Generator().manual_seed(1)
    out = sample_tokens(logits, temperature=torch.tensor([0.0, 1.0, 1.0, 0.7, 1e-6, 2.0]),
                        top_k=torch.tensor([0, 1, 0, 0, 0, 3]), top_p=torch.tensor([1.0, 1.0, 1e-6, 1.0, 1.0, 1.0]),
                        generator=gen)
    best = logits.argmax(-1)
    # greedy, top_k=1, top_p -> 0 and temperature -> 0 all reduce to argmax
    assert out[[0, 1, 2, 4]].tolist() == best[[0, 1, 2, 4]].tolist()
    assert out[5].item() in logits[5].topk(3).indices.tolist()


def test_sampling_matches_softmax_distribution():
    logits = torch.tensor([0.0, 1.0, 2.0, -1.0])
    gen = torch.Generator().manual_seed(0)
    draws = 40000
    tokens = sample_tokens(logits.repeat(draws, 1), temperature=0.5, generator=gen)
    freq = torch.bincount(tokens, minlength=4).double() / draws
    expect = torch.softmax(logits.double() / 0.5, -1)
    # 5 standard errors of a binomial proportion: fails only on a real bias
    tol = 5 * torch.sqrt(expect * (1 - expect) / draws) + 1e-3
    assert ((freq - expect).abs() <= tol).all(), (freq, expect)


def test_top_k_and_top_p_sample_renormalised_survivors():
    logits = torch.tensor([2.0, 1.0, 0.0, -5.0]).log_softmax(-1)
    gen = torch.Generator().manual_seed(3)
    tokens = sample_tokens(logits.repeat(20000, 1), top_k=2, generator=gen)
    freq = torch.bincount(tokens, minlength=4).double() / 20000
    p = torch.softmax(torch.tensor([2.0, 1.0]).double(), -1)
    assert freq[2:].sum() == 0
    assert math.isclose(freq[0].item(), p[0].item(), abs_tol=0.02)
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    tokens = sample_tokens(probs.log().repeat(20000, 1), top_p=0.75, generator=gen)
    freq = torch.bincount(tokens, minlength=4).double() / 20000
    assert freq[2:].sum() == 0 and math.isclose(freq[0].item(), 0.5 / 0.8, abs_tol=0.02)


def test_same_generator_state_same_tokens_and_generator_advances():
    logits = torch.randn(8, 100, generator=torch.Generator().manual_seed(0))
    a = sample_tokens(logits, generator=torch.Generator().manual_seed(7))
    b = sample_tokens(logits, generator=torch.Generator().manual_seed(7))
    assert torch.equal(a, b)
    gen = torch.Generator().manual_seed(7)
    first, second = sample_tokens(logits, generator=gen), sample_tokens(logits, generator=gen)
    assert not torch.equal(first, second)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_any_logit_dtype_gives_int64_tokens(dtype):
    out = sample_tokens(torch.randn(3, 10).to(dtype), temperature=0.8, top_p=0.9, top_k=5,
                        generator=torch.Generator().manual_seed(0))
    assert out.dtype == torch.int64 and out.shape == (3,)


def test_draw_never_takes_a_filtered_token_even_at_the_edges():
    scaled = torch.tensor([[float("-inf"), 0.0, float("-inf"), 1.0, float("-inf")]] * 4)
    u = torch.tensor([0.0, 0.3, 0.9999999, 1.0])   # 1.0 stands for a u x total rounded up to the total
    tokens = draw(scaled, u)
    assert tokens.tolist()[0] == 1 and tokens.tolist()[-1] == 3
    assert set(tokens.tolist()) <= {1, 3}
