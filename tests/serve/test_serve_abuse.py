"""`rlctl serve` under load and abuse, over real HTTP: the official `openai` client and raw sockets.

Two servers for the module: a real `rlctl serve` process (--max-body-bytes 64 KiB,
--max-concurrency 16, --read-timeout-s 20), and for the slow clients and the count of live
objects the same server built in this process (make_server + Engine, as serve_builtin does) with
a read time-out of 2 s. A 2 s time-out on the process would also cut off some of the 256 burst's
own requests on a loaded 2-core machine: the client writes a request's headers and body
separately, and 256 of them from one event loop can take seconds.
"""

from __future__ import annotations

import asyncio
import collections
import gc
import importlib.util
import json
import logging
import signal
import socket
import threading
import time
import types
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from support.servers import ServerProcess

BENCH = Path(__file__).resolve().parents[2] / "bench" / "serve_memory_bench.py"
_spec = importlib.util.spec_from_file_location("serve_memory_bench", BENCH)
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)  # the memory bench's traffic mix and client, run smaller below

KEY, NAME, ROWS, READ_TIMEOUT_S = bench.KEY, "m", 16, 2


@pytest.fixture(scope="module")
def srv(tiny_model_dir):
    server = ServerProcess([str(tiny_model_dir), "--engine", "hf", "--port", "0", "--api-key", KEY,
                            "--served-model-name", NAME, "--max-concurrency", str(ROWS),
                            "--read-timeout-s", "20", "--max-body-bytes", str(bench.MAX_BODY)])
    yield server
    assert server.stop(signal.SIGTERM) == 0, "".join(server.stderr_lines[-20:])


@pytest.fixture(scope="module")
def local(tiny_model_dir):
    """The server of `rlctl serve` in this process, read time-out 2 s; its log kept quiet, since
    pytest keeps every captured record (the live-object count would see them)."""
    from rlctl.serve.engine import Engine
    from rlctl.serve.server import make_server
    from rlctl.serve.source import load_model

    model, tokenizer = load_model(tiny_model_dir, "auto")
    server = make_server(None, "127.0.0.1", 0, model_name=NAME, api_key=KEY,
                         limits={"max_body_bytes": bench.MAX_BODY, "read_timeout_s": READ_TIMEOUT_S})
    server.engine = Engine(model, tokenizer, max_rows=ROWS)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    quiet = logging.getLogger("rlctl.serve")
    level, quiet.level = quiet.level, logging.WARNING
    yield types.SimpleNamespace(base_url=f"http://127.0.0.1:{server.server_address[1]}")
    quiet.setLevel(level)
    server.shutdown()
    server.engine.shutdown(timeout=5)
    server.server_close()


def _address(server) -> tuple[str, int]:  # server: anything with a base_url
    url = urllib.parse.urlsplit(server.base_url)
    return url.hostname, url.port


def _health(server) -> dict:
    with urllib.request.urlopen(server.base_url + "/health", timeout=30) as r:
        return json.loads(r.read())


def _wait_for(server, predicate, timeout_s: float = 20.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while not predicate(health := _health(server)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return health


def _stream_request(body: dict) -> bytes:
    data = json.dumps({"model": NAME, **body}).encode()
    return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + KEY.encode() + b"\r\nContent-Length: " + str(len(data)).encode()
            + b"\r\n\r\n" + data)


@pytest.mark.slow
def test_256_concurrent_streams_all_complete_with_their_own_answer(srv):
    openai = pytest.importorskip("openai")
    client = openai.AsyncOpenAI(base_url=srv.base_url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    kwargs = dict(model=NAME, max_tokens=8, temperature=1.0, extra_body={"ignore_eos": True})

    async def stream(i: int, started: asyncio.Event) -> tuple[str, list, int]:
        chunks = await client.chat.completions.create(
            messages=[{"role": "user", "content": f"request {i}"}], seed=i, stream=True,
            stream_options={"include_usage": True}, **kwargs)
        text, finishes, tokens = "", [], 0
        async for chunk in chunks:
            started.set()
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
            for c in chunk.choices:
                text += c.delta.content or ""
                finishes += [c.finish_reason] if c.finish_reason else []
        return text, finishes, tokens

    async def burst():
        started = asyncio.Event()
        tasks = [asyncio.create_task(stream(i, started)) for i in range(256)]
        await started.wait()
        during = await asyncio.to_thread(_health, srv)  # the server answers while the burst is queued
        results = await asyncio.gather(*tasks)
        # The same seeded requests, one at a time: each stream carried its own request's answer.
        alone = [await client.chat.completions.create(messages=[{"role": "user", "content": f"request {i}"}],
                                                      seed=i, **kwargs) for i in (0, 97, 255)]
        await client.close()
        return during, results, alone

    during, results, alone = asyncio.run(burst())
    assert during["running"] + during["waiting"] > 0, during
    assert all(finishes == ["length"] and tokens == 8 and text for text, finishes, tokens in results)
    assert [results[i][0] for i in (0, 97, 255)] == [r.choices[0].message.content for r in alone]
    assert len({text for text, _, _ in results}) > 200, "streams should differ: each has its own prompt and seed"
    health = _health(srv)
    assert health["running"] == 0 and health["waiting"] == 0 and 1 < health["peak_running"] <= ROWS


@pytest.mark.slow
def test_clients_that_disconnect_mid_stream_free_their_slots(srv):
    before = _health(srv)
    body = {"messages": [{"role": "user", "content": "long"}], "max_tokens": 1500, "stream": True,
            "ignore_eos": True}  # only the disconnect can end these rows early
    socks = [socket.create_connection(_address(srv), timeout=30) for _ in range(ROWS + 8)]
    for sock in socks:
        sock.sendall(_stream_request(body))
    for sock in socks:  # every one got its headers and role chunk: a full batch running, 8 waiting
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
    full = _wait_for(srv, lambda h: h["running"] == ROWS and h["waiting"] == 8)
    assert (full["running"], full["waiting"]) == (ROWS, 8), full
    for sock in socks:
        sock.close()
    after = _wait_for(srv, lambda h: h["running"] == 0 and h["waiting"] == 0)
    assert (after["running"], after["waiting"]) == (0, 0), f"slots still held after the clients left: {after}"
    assert after["cancelled"] - before["cancelled"] >= ROWS, "the rows ended on their own, not by the disconnects"
    reply = json.loads(urllib.request.urlopen(urllib.request.Request(  # a newcomer is served at once
        srv.base_url + "/v1/completions", json.dumps({"model": NAME, "prompt": "hi", "max_tokens": 3}).encode(),
        {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}), timeout=30).read())
    assert reply["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.slow
def test_body_over_the_limit_is_413_before_the_body_is_sent(srv):
    limits = f"up to {bench.MAX_BODY} bytes (--max-body-bytes), each request read within 20 s"
    assert limits in "".join(srv.stderr_lines)  # the flags reached the server
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key=KEY, max_retries=0, timeout=30)
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model=NAME, prompt="x" * (bench.MAX_BODY + 10), max_tokens=1)
    assert e.value.status_code == 413 and "--max-body-bytes" in str(e.value)
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode()
            + b"\r\nContent-Length: " + str(10 << 20).encode() + b"\r\n")
    for expect in (b"", b"Expect: 100-continue\r\n"):  # the answer comes with not one byte of body sent
        with socket.create_connection(_address(srv), timeout=10) as sock:
            sock.sendall(head + expect + b"\r\n")
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 413") and b"request_too_large" in answer, answer


def _slow_client(server, data: bytes, out: dict, key: str, at_once: int = 0) -> None:
    """Send `data` one byte a second (its first `at_once` bytes at once) until dropped."""
    start = time.monotonic()
    with socket.create_connection(_address(server), timeout=30) as sock:
        sock.sendall(data[:at_once])
        try:
            for byte in data[at_once:]:
                sock.sendall(bytes([byte]))
                time.sleep(1.0)
            got = sock.recv(4096)
        except (BrokenPipeError, ConnectionResetError):
            got = b""
        while chunk := sock.recv(4096):
            got += chunk
    out[key] = (got, time.monotonic() - start)


def _idle_client(server, out: dict) -> None:
    start = time.monotonic()
    with socket.create_connection(_address(server), timeout=30) as sock:
        out["idle"] = (sock.recv(4096), time.monotonic() - start)


@pytest.mark.slow
def test_slow_and_idle_clients_are_dropped_while_others_are_served(local):
    openai = pytest.importorskip("openai")
    out: dict = {}
    headers = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n\r\n"
    body = _stream_request({"messages": [{"role": "user", "content": "slow body " * 4}], "max_tokens": 2})
    threads = [threading.Thread(target=_slow_client, args=(local, headers, out, "headers")),
               threading.Thread(target=_slow_client, args=(local, body, out, "body", body.index(b"\r\n\r\n") + 4)),
               threading.Thread(target=_idle_client, args=(local, out))]
    for t in threads:
        t.start()
    client = openai.OpenAI(base_url=local.base_url + "/v1", api_key=KEY, max_retries=0, timeout=30)
    served = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert all(t.is_alive() for t in threads), "the slow clients should still be connected meanwhile"
    for t in threads:
        t.join(30)
    assert set(out) == {"headers", "body", "idle"}, f"still connected after 30 s: {set(out)}"
    assert served.choices[0].finish_reason in ("stop", "length")
    for key in ("headers", "body"):  # at one byte a second they would need a minute: cut off after 2 s
        answer, seconds = out[key]
        assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer, (key, answer)
        assert READ_TIMEOUT_S <= seconds < 9, (key, seconds)
    assert out["idle"][0] == b"" and READ_TIMEOUT_S <= out["idle"][1] < 9, out["idle"]  # closed silently


@pytest.mark.slow
def test_max_tokens_beyond_the_context_and_a_wrong_key(srv):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key=KEY, max_retries=0, timeout=30)
    context = client.models.retrieve(NAME).model_extra["max_model_len"]
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=context)
    assert e.value.code == "context_length_exceeded" and e.value.param == "max_tokens"
    for wrong in ("", "wrong", KEY[:-1], KEY + "x", KEY.upper()):
        bad = openai.OpenAI(base_url=srv.base_url + "/v1", api_key=wrong or "-", max_retries=0, timeout=30)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()


# isinstance() against an ABC caches the class checked as a weak reference with a bound `_destroy`
# callback, and an ABC registering a class (a lazy import anywhere) empties those caches: they
# refill by tens, at most once per class. Not kept per request, so not counted.
ABC_CACHE_TYPES = ("ReferenceType", "builtin_function_or_method")


def _live_objects(threads: int) -> collections.Counter:
    """Live objects by type, once the server's connection threads are gone (down to `threads`):
    a thread still closing its socket holds objects that are not kept per request."""
    deadline = time.monotonic() + 15
    while threading.active_count() > threads and time.monotonic() < deadline:
        time.sleep(0.05)
    gc.collect()
    counts = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
    return collections.Counter({k: v for k, v in counts.items() if k not in ABC_CACHE_TYPES})


def test_nothing_is_kept_per_request(local):
    """The memory bench's traffic (every kind, good and bad), smaller and in this process, where
    the live Python objects can be counted: 300 requests to warm up, then 1,000 more. Anything
    kept per request (a list of finished requests, their events, a cache), even for one kind of
    the ten (100 requests), adds at least 100 objects; measured: 0 or 1. The process's RSS over
    10,000 requests is bench/serve_memory_bench.py's job."""
    idle = threading.active_count()
    assert not bench.run(local.base_url, 300, 8, lambda: None)
    before = _live_objects(idle)
    assert not bench.run(local.base_url, 1000, 8, lambda: None)
    after = _live_objects(idle)
    grown = after.total() - before.total()
    assert grown < 50, f"{grown} more live objects after 1,000 more requests: {(after - before).most_common(5)}"
