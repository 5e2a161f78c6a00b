"""`rlctl serve` under load and abuse, over real HTTP: the official `openai` client and raw sockets.

One server for the module, started with small limits so each abuse shows quickly:
--read-timeout-s 2, --max-body-bytes 64 KiB, --max-concurrency 16.
"""

from __future__ import annotations

import asyncio
import gc
import importlib.util
import json
import logging
import signal
import socket
import threading
import time
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
                            "--read-timeout-s", str(READ_TIMEOUT_S), "--max-body-bytes", str(bench.MAX_BODY)])
    yield server
    assert server.stop(signal.SIGTERM) == 0, "".join(server.stderr_lines[-20:])


def _address(server) -> tuple[str, int]:
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


def test_body_over_the_limit_is_413_before_the_body_is_sent(srv):
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


def _slow_client(server, data: bytes, out: dict, key: str) -> None:
    """Send `data` one byte every 0.5 s (after the first len - 20 bytes at once) until dropped."""
    start = time.monotonic()
    with socket.create_connection(_address(server), timeout=30) as sock:
        sock.sendall(data[:-20])
        try:
            for byte in data[-20:]:
                time.sleep(0.5)
                sock.sendall(bytes([byte]))
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


def test_slow_and_idle_clients_are_dropped_while_others_are_served(srv):
    openai = pytest.importorskip("openai")
    out: dict = {}
    headers = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n\r\n"
    body = _stream_request({"messages": [{"role": "user", "content": "slow body " * 4}], "max_tokens": 2})
    threads = [threading.Thread(target=_slow_client, args=(srv, headers, out, "headers")),
               threading.Thread(target=_slow_client, args=(srv, body, out, "body")),
               threading.Thread(target=_idle_client, args=(srv, out))]
    for t in threads:
        t.start()
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key=KEY, max_retries=0, timeout=30)
    served = client.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
    assert all(t.is_alive() for t in threads), "the slow clients should still be connected meanwhile"
    for t in threads:
        t.join(30)
    assert served.choices[0].finish_reason in ("stop", "length")
    for key in ("headers", "body"):  # 20 bytes at 2 per second would need 10 s: cut off after 2 s
        answer, seconds = out[key]
        assert answer.startswith(b"HTTP/1.1 408") and b"request_timeout" in answer, (key, answer)
        assert READ_TIMEOUT_S <= seconds < 9, (key, seconds)
    assert out["idle"][0] == b"" and READ_TIMEOUT_S <= out["idle"][1] < 9, out["idle"]  # closed silently


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


def _count_live_objects() -> int:
    time.sleep(0.3)  # the last handler threads finish closing their connections
    gc.collect()
    return len(gc.get_objects())


def test_nothing_is_kept_per_request(tiny_model_dir):
    """The memory bench's traffic (every kind, good and bad), smaller and in this process, where
    the live Python objects can be counted: the server `rlctl serve` builds (make_server + Engine,
    as serve_builtin does), 300 requests to warm up, then 1,000 more. Anything kept per request
    (a list of finished requests, their events, a cache) adds at least 1,000 objects; measured:
    0 or 1. The process's RSS over 10,000 requests is bench/serve_memory_bench.py's job."""
    from rlctl.serve.engine import Engine
    from rlctl.serve.server import make_server
    from rlctl.serve.source import load_model

    model, tokenizer = load_model(tiny_model_dir, "auto")
    server = make_server(None, "127.0.0.1", 0, model_name=NAME, api_key=KEY,
                         limits={"max_body_bytes": bench.MAX_BODY, "read_timeout_s": READ_TIMEOUT_S})
    server.engine = Engine(model, tokenizer, max_rows=ROWS)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    quiet = logging.getLogger("rlctl.serve")
    level, quiet.level = quiet.level, logging.WARNING  # pytest keeps every captured log record
    try:
        assert not bench.run(url, 300, 8, lambda: None)
        before = _count_live_objects()
        assert not bench.run(url, 1000, 8, lambda: None)
        grown = _count_live_objects() - before
    finally:
        quiet.setLevel(level)
        server.shutdown()
        server.engine.shutdown(timeout=5)
        server.server_close()
    assert grown < 100, f"{grown} more live objects after 1,000 more requests"
