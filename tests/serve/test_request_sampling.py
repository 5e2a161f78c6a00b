"""Per-row sampling and streamed detokenization with stop strings."""

from __future__ import annotations

import pytest
import torch

from rlctl.serve.request_sampling import sample_next_tokens
from rlctl.api.textstream import TextStream


def _params(b, temperature=1.0, top_p=1.0, top_k=0):
    return (torch.full((b,), float(temperature)), torch.full((b,), float(top_p)),
            torch.full((b,), top_k, dtype=torch.long))


def test_greedy_top_k_1_and_tiny_top_p_all_pick_the_argmax():
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(0))
    best = logits.argmax(-1)
    gens = [None] * 6
    assert torch.equal(sample_next_tokens(logits, *_params(6, temperature=0), gens), best)
    assert torch.equal(sample_next_tokens(logits, *_params(6, top_k=1), gens), best)
    assert torch.equal(sample_next_tokens(logits, *_params(6, top_p=1e-6), gens), best)


def test_rows_keep_their_own_parameters():
    logits = torch.randn(3, 40, generator=torch.Generator().manual_seed(1))
    temperature = torch.tensor([0.0, 1.0, 5.0])
    top_p, top_k = torch.tensor([1.0, 1.0, 1.0]), torch.tensor([0, 3, 0])
    seen = [set(), set(), set()]
    for seed in range(60):
        g = torch.Generator().manual_seed(seed)
        out = sample_next_tokens(logits, temperature, top_p, top_k, [g, g, g])
        for b in range(3):
            seen[b].add(int(out[b]))
    assert seen[0] == {int(logits[0].argmax())}  # greedy row
    assert seen[1] <= set(logits[1].topk(3).indices.tolist()) and len(seen[1]) > 1  # top-k row
    assert len(seen[2]) > 10  # hot, unfiltered row


def test_top_p_keeps_the_smallest_prefix_reaching_the_mass():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().expand(3000, 4).contiguous()
    for top_p, allowed in ((0.8, {0, 1}), (0.81, {0, 1, 2})):
        out = sample_next_tokens(logits, *_params(3000, top_p=top_p), [None] * 3000,
                                 torch.Generator().manual_seed(0))
        assert set(out.tolist()) == allowed


def test_sampling_follows_the_distribution():
    probs = torch.tensor([0.6, 0.3, 0.1, 0.0])
    logits = probs.log().expand(4000, 4).contiguous()
    out = sample_next_tokens(logits, *_params(4000), [None] * 4000, torch.Generator().manual_seed(3))
    freq = torch.bincount(out, minlength=4).float() / 4000
    assert torch.allclose(freq, probs, atol=0.03), freq
    assert freq[3] == 0


def test_a_seeded_row_does_not_depend_on_its_neighbours():
    logits = torch.randn(5, 30, generator=torch.Generator().manual_seed(2))
    alone = sample_next_tokens(logits[2:3], *_params(1), [torch.Generator().manual_seed(42)])
    gens = [None, None, torch.Generator().manual_seed(42), None, None]
    together = sample_next_tokens(logits, *_params(5), gens, torch.Generator().manual_seed(0))
    assert together[2] == alone[0]


def _byte_decode(ids):
    return bytes(ids).decode("utf-8", errors="replace")


def _feed(stream, text):
    out, stopped = "", False
    for b in text.encode():
        delta, stopped = stream.push(b)
        out += delta
        if stopped:
            break
    return out, stopped


def test_multibyte_characters_are_never_split():
    stream = TextStream(_byte_decode)
    deltas = [stream.push(b)[0] for b in "é😀a".encode()]
    assert "".join(deltas) == "é😀a"
    assert all("\ufffd" not in d for d in deltas)
    assert deltas[:2] == ["", "é"]  # the first byte of é is held until the character is complete


@pytest.mark.parametrize("text, stop, expected", [
    ("hello world", ("wor",), "hello "),
    ("hello world", ("xyz",), "hello world"),
    ("abcabd", ("abd",), "abc"),  # a held-back partial match "ab" is released, then the real one cuts
    ("one two", ("two", " t"), "one"),  # the earliest stop wins
])
def test_stop_strings_cut_the_text_and_are_not_emitted(text, stop, expected):
    stream = TextStream(_byte_decode, stop)
    out, stopped = _feed(stream, text)
    out += stream.flush()
    assert out == expected == stream.text
    assert stopped == (expected != text)


def test_possible_stop_prefix_is_held_back_until_resolved():
    stream = TextStream(_byte_decode, ("END",))
    assert stream.push(ord("a")) == ("a", False)
    assert stream.push(ord("E")) == ("", False)  # might be the start of END
    assert stream.push(ord("N")) == ("", False)
    assert stream.push(ord("x")) == ("ENx", False)  # it was not
    assert stream.flush() == ""
