"""The official `openai` client against a real `rlctl serve` process (tiny random model, CPU)."""

from __future__ import annotations

import concurrent.futures
import json
import urllib.request

import pytest

pytestmark = pytest.mark.slow   # starts Ray, trains a run or starts a subprocess

CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "What is 2 + 2?"}]


def _health(server) -> dict:
    with urllib.request.urlopen(server.base_url + "/health", timeout=10) as r:
        return json.loads(r.read())


def test_models_list_names_the_served_model(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"


def test_chat_completion_shape_and_usage(client, tiny_model_dir):
    from transformers import AutoTokenizer

    r = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=12, temperature=0.8)
    choice = r.choices[0]
    assert r.object == "chat.completion" and r.model == "tiny" and r.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    # Usage counts the prompt exactly as the chat template renders it.
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    rendered = tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)
    assert r.usage.prompt_tokens == len(tok(rendered, add_special_tokens=False)["input_ids"])
    assert 1 <= r.usage.completion_tokens <= 12
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    if choice.finish_reason == "length":
        assert r.usage.completion_tokens == 12


def test_completion_hits_max_tokens_and_reports_length(client):
    # The random tiny model almost never emits <|im_end|> as a first token; 5 tokens is a tight cap.
    r = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=5, temperature=1.0,
                                  seed=11)
    assert r.object == "text_completion"
    assert r.usage.prompt_tokens == len("Once upon a time".encode())  # byte-level tokenizer
    assert r.usage.completion_tokens <= 5
    if r.choices[0].finish_reason == "length":
        assert r.usage.completion_tokens == 5


def test_completion_with_several_prompts_indexes_choices(client):
    r = client.completions.create(model="tiny", prompt=["ab", "cd", "ef"], max_tokens=4, n=2, seed=5)
    assert sorted(c.index for c in r.choices) == list(range(6))
    assert r.usage.prompt_tokens == 6


def test_seed_reproduces_and_n_choices_differ(client):
    kwargs = dict(model="tiny", messages=CHAT, max_tokens=24, temperature=1.0, seed=1234, n=3)
    first = client.chat.completions.create(**kwargs)
    again = client.chat.completions.create(**kwargs)
    texts = [c.message.content for c in first.choices]
    assert [c.index for c in first.choices] == [0, 1, 2]
    assert texts == [c.message.content for c in again.choices]
    assert len(set(texts)) > 1, "the n choices of one request must be different samples"
    other = client.chat.completions.create(**{**kwargs, "seed": 99, "n": 1})
    assert other.choices[0].message.content != texts[0]


def test_temperature_zero_is_deterministic_without_seed(client):
    a = client.completions.create(model="tiny", prompt="xyz", max_tokens=8, temperature=0)
    b = client.completions.create(model="tiny", prompt="xyz", max_tokens=8, temperature=0)
    assert a.choices[0].text == b.choices[0].text


def test_stop_string_cuts_the_text(client):
    # Find what the model says greedily, then stop on a piece of it: the answer must end before it.
    full = client.completions.create(model="tiny", prompt="stop test", max_tokens=12, temperature=0)
    text = full.choices[0].text
    assert len(text) >= 4, text
    stop = text[2:4]
    r = client.completions.create(model="tiny", prompt="stop test", max_tokens=12, temperature=0, stop=[stop])
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == text[: text.index(stop)]


def test_chat_streaming_matches_the_non_streamed_answer(client):
    kwargs = dict(model="tiny", messages=CHAT, max_tokens=16, temperature=0.9, seed=7)
    whole = client.chat.completions.create(**kwargs).choices[0]
    chunks = list(client.chat.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert text == whole.message.content
    assert finishes == [whole.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1


def test_completion_streaming_with_n(client):
    stream = client.completions.create(model="tiny", prompt="hello", max_tokens=6, n=2, seed=3, stream=True)
    texts, finished = {0: "", 1: ""}, set()
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.text
            if c.finish_reason:
                finished.add(c.index)
    assert finished == {0, 1}
    whole = client.completions.create(model="tiny", prompt="hello", max_tokens=6, n=2, seed=3)
    assert texts == {c.index: c.text for c in whole.choices}


def test_health_needs_no_key(server):
    assert _health(server)["status"] == "ok"


def test_burst_of_concurrent_requests_all_succeed_and_are_batched(client, server):
    def one(i):
        r = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": f"request number {i}"}],
            max_tokens=8 + i % 5, temperature=0.7, seed=i)
        return r.choices[0].finish_reason, r.usage.completion_tokens

    with concurrent.futures.ThreadPoolExecutor(24) as pool:
        results = list(pool.map(one, range(24)))
    assert len(results) == 24 and all(f in ("stop", "length") and n >= 1 for f, n in results)
    health = _health(server)
    assert health["peak_running"] > 1, "concurrent requests were served one at a time"
    assert health["peak_running"] <= 8  # --max-concurrency bounds the batch
    assert health["running"] == 0 and health["waiting"] == 0


def test_key_is_checked_by_the_client(server):
    import openai

    bad = openai.OpenAI(base_url=server.base_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.models.list()
    assert e.value.status_code == 401 and "API key" in str(e.value)
