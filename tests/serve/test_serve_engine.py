"""The continuous-batching engine in-process: joining/leaving rows must not change anyone's answer."""

from __future__ import annotations

import queue
import time

import pytest
import torch

from rlctl.serve.batch import DecodeBatch
from rlctl.api.requests import Request, SamplingParams
from rlctl.serve.engine import Engine


@pytest.fixture(scope="module")
def engine(tiny_model_dir):
    from rlctl.serve.source import load_model

    model, tokenizer = load_model(tiny_model_dir, "float32", "cpu")
    eng = Engine(model, tokenizer, max_rows=4)
    yield eng
    eng.shutdown(timeout=5)


def _submit(engine, prompt: str, **params) -> Request:
    req = Request(engine.encode(prompt), SamplingParams(**params), queue.Queue())
    assert engine.submit(req)
    return req


def _collect(req: Request, timeout: float = 60) -> list[tuple[str, str, int]]:
    texts, finish, tokens = {}, {}, {}
    while len(finish) < req.params.n:
        ev = req.events.get(timeout=timeout)
        texts[ev.index] = texts.get(ev.index, "") + ev.text
        tokens[ev.index] = ev.completion_tokens
        if ev.finish_reason:
            finish[ev.index] = ev.finish_reason
    return [(texts.get(i, ""), finish[i], tokens[i]) for i in range(req.params.n)]


def test_padded_batch_gives_the_same_logits_as_one_row(engine):
    """Left padding, joins and leaves must not move any row's logits (up to float rounding)."""
    model = engine.model
    prompts = [[5, 6, 7, 8, 9], list(range(30, 42)), [100, 101, 102]]
    feeds = torch.randint(0, 256, (3, 8), generator=torch.Generator().manual_seed(0))

    def alone(i, steps):
        batch, logits = DecodeBatch.prefill(model, [prompts[i]], engine.pad_id)
        out = [logits[0]]
        for s in range(steps):
            out.append(batch.decode(model, feeds[i, s:s + 1])[0])
        return out

    batch, logits = DecodeBatch.prefill(model, prompts[:2], engine.pad_id)
    got = {0: [logits[0]], 1: [logits[1]], 2: []}
    rows, pos = [0, 1], {0: 0, 1: 0, 2: 0}

    def step():
        tokens = torch.stack([feeds[r, pos[r]] for r in rows])
        for r in rows:
            pos[r] += 1
        out = batch.decode(model, tokens)
        for j, r in enumerate(rows):
            got[r].append(out[j])

    step(); step()
    late, late_logits = DecodeBatch.prefill(model, [prompts[2]], engine.pad_id)
    batch.extend(late)
    rows.append(2)
    got[2].append(late_logits[0])
    step(); step(); step()
    batch.keep([1, 2])  # row 0 leaves; its padding columns are trimmed
    rows = [1, 2]
    step()
    assert batch.attention_mask.shape[0] == 2
    for r in range(3):
        reference = alone(r, len(got[r]) - 1)
        for a, b in zip(reference, got[r]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_seeded_answer_is_the_same_alone_and_inside_a_changing_batch(engine):
    params = dict(max_tokens=20, temperature=1.0, seed=77, ignore_eos=True)
    alone = _collect(_submit(engine, "the same question", **params))
    long_one = _submit(engine, "a longer running neighbour", max_tokens=40, ignore_eos=True)
    long_one.events.get(timeout=60)  # it is decoding: the next two join a running batch
    again = _submit(engine, "the same question", **params)
    short = _submit(engine, "short", max_tokens=3, ignore_eos=True)  # leaves early
    assert _collect(again) == alone
    assert _collect(short)[0][1:] == ("length", 3)
    assert _collect(long_one)[0][1:] == ("length", 40)


def test_more_requests_than_rows_wait_their_turn(engine):
    reqs = [_submit(engine, f"queued {i}", max_tokens=6, n=2, ignore_eos=True) for i in range(5)]
    for req in reqs:
        assert [(f, t) for _, f, t in _collect(req)] == [("length", 6)] * 2
    assert 1 < engine.peak_rows <= engine.max_rows


def test_cancelled_request_leaves_the_batch(engine):
    req = _submit(engine, "cancel me", max_tokens=1500, ignore_eos=True)
    req.events.get(timeout=60)
    before = engine.cancelled_rows
    req.cancel()
    deadline = time.monotonic() + 10
    while engine.load()["running"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.load()["running"] == 0
    assert engine.cancelled_rows == before + 1
