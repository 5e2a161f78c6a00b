"""The continuous-batching engine in-process: joining/leaving rows must not change anyone's answer."""

from __future__ import annotations

import queue
import time

import pytest
import torch

from rlctl.serve.batch import LiveBatch
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


@pytest.mark.parametrize("fast", [True, False], ids=["DecoderRunner", "HFCacheRunner"])
def test_rows_joining_and_leaving_get_the_logits_of_one_whole_forward(engine, fast):
    """Left padding, joins (a request's n choices as copies of its row), leaves and regroups (a
    DecoderRunner with room for 3 tokens folds its rows' KV into prompts every 3 steps) must not
    move any row's logits: each equals the model's own forward over that row's tokens so far."""
    from rlctl.workers.rollout.decoder import DecoderRunner

    model = engine.model
    prompts = [[5, 6, 7, 8, 9], list(range(30, 42)), [100, 101, 102]]
    feeds = torch.randint(0, 256, (4, 9), generator=torch.Generator().manual_seed(0))
    batch = LiveBatch(model, pad_id=engine.pad_id, context_length=engine.context_length, rows_hint=4,
                      fast=fast, room=3)
    assert isinstance(batch.runner, DecoderRunner) == fast
    logits = batch.admit(prompts[:2], [0, 1])
    rows = {0: 0, 1: 1}                                # live row -> its prompt
    seen = {0: [], 1: [], 2: [], 3: []}                # live row id -> [(tokens so far, logits)]
    ids = {0: 0, 1: 1}                                 # live row -> row id
    fed = {0: 0, 1: 0, 2: 0, 3: 0}

    def record(out):
        for j, rid in enumerate(ids.values()):
            seen[rid].append((prompts[rows[j]] + feeds[rid, :fed[rid]].tolist(), out[j]))

    def step():
        tokens = torch.stack([feeds[rid, fed[rid]] for rid in ids.values()])
        for rid in ids.values():
            fed[rid] += 1
        record(batch.decode(tokens))

    record(logits)
    step(); step()
    late = batch.admit([prompts[2]], [0, 0])           # one request, two choices, joins running rows
    rows.update({2: 2, 3: 2})
    ids.update({2: 2, 3: 3})
    for j, rid in ((2, 2), (3, 3)):
        seen[rid].append((prompts[2], late[j - 2]))
    step(); step(); step()
    batch.keep([1, 2, 3])                              # row 0 leaves
    rows, ids = {0: 1, 1: 2, 2: 2}, {0: 1, 1: 2, 2: 3}
    step(); step(); step(); step()
    assert batch.size == 3 and batch.positions.tolist() == [12 + 9, 3 + 7, 3 + 7]
    with torch.no_grad():
        for rid, entries in seen.items():
            for tokens, got in entries:
                want = model(torch.tensor([tokens])).logits[0, -1]
                torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


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
