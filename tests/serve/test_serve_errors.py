"""Every bad request gets a 4xx with OpenAI's error JSON, and the server keeps serving."""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.parse

import pytest

pytestmark = pytest.mark.slow   # starts Ray, trains a run or starts a subprocess

API_KEY = "test-key-123"  # the key conftest's server was started with


def _raw(server, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
    """One request over a fresh connection; returns (status, parsed JSON body)."""
    url = urllib.parse.urlsplit(server.base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=30)
    hdrs = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json", **(headers or {})}
    conn.request(method, path, body=body, headers=hdrs)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, json.loads(data) if data else None


def _post(server, path: str, obj) -> tuple[int, dict]:
    return _raw(server, "POST", path, json.dumps(obj).encode())


def _assert_openai_error(status: int, body: dict, expected: int, param: str | None = None) -> None:
    assert status == expected, body
    assert set(body) == {"error"} and isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert {"type", "param", "code"} <= set(body["error"])
    if param is not None:
        assert body["error"]["param"] == param, body


CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.mark.parametrize("change, param", [
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": 3.5}, "temperature"),
    ({"max_tokens": "10"}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"n": 2.5}, "n"),
    ({"top_p": 0}, "top_p"),
    ({"stop": [1, 2]}, "stop"),
    ({"seed": "abc"}, "seed"),
    ({"stream": "yes"}, "stream"),
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"content": "no role"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"logprobs": True}, "logprobs"),
])
def test_wrong_types_and_values_are_400(server, change, param):
    _assert_openai_error(*_post(server, "/v1/chat/completions", {**CHAT, **change}), 400, param)


def test_unknown_model_is_404(server):
    _assert_openai_error(*_post(server, "/v1/chat/completions", {**CHAT, "model": "gpt-9"}), 404, "model")
    _assert_openai_error(*_raw(server, "GET", "/v1/models/gpt-9"), 404)


def test_missing_model_is_400(server):
    body = dict(CHAT)
    body.pop("model")
    _assert_openai_error(*_post(server, "/v1/chat/completions", body), 400, "model")


def test_max_tokens_beyond_the_context_is_400(server):
    status, body = _post(server, "/v1/chat/completions", {**CHAT, "max_tokens": 100_000})
    _assert_openai_error(status, body, 400, "max_tokens")
    assert body["error"]["code"] == "context_length_exceeded" and "2048" in body["error"]["message"]
    status, body = _post(server, "/v1/completions", {"model": "tiny", "prompt": "x" * 3000})
    _assert_openai_error(status, body, 400)
    assert body["error"]["code"] == "context_length_exceeded"


def test_n_larger_than_the_batch_is_400(server):
    _assert_openai_error(*_post(server, "/v1/chat/completions", {**CHAT, "n": 9}), 400, "n")
    _assert_openai_error(*_post(server, "/v1/completions",
                                {"model": "tiny", "prompt": ["a", "b", "c"], "n": 3}), 400, "prompt")


def test_invalid_json_and_non_object_bodies_are_400(server):
    _assert_openai_error(*_raw(server, "POST", "/v1/chat/completions", b"{not json"), 400)
    _assert_openai_error(*_raw(server, "POST", "/v1/chat/completions", b"\xff\xfe"), 400)
    _assert_openai_error(*_raw(server, "POST", "/v1/chat/completions", b"[1, 2]"), 400)


def test_bad_completion_prompts_are_400(server):
    for prompt in (None, 5, [], [1.5], [[]], "", [-1], [10**9]):
        _assert_openai_error(*_post(server, "/v1/completions", {"model": "tiny", "prompt": prompt}), 400)


def test_json_nested_too_deep_is_400(server):
    """Past MAX_JSON_DEPTH (64) levels, and far past the parser's own recursion limit: a 400, not a 500."""
    for depth in (65, 100_000):
        body = json.dumps({**CHAT, "x": 0}).replace("0}", "[" * (depth - 1) + "]" * (depth - 1) + "}")
        _assert_openai_error(*_raw(server, "POST", "/v1/chat/completions", body.encode()), 400)
    assert _post(server, "/v1/chat/completions", {**CHAT, "x": json.loads("[" * 63 + "]" * 63)})[0] == 200


def test_oversized_body_is_413(server):
    big = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * (5 << 20)}]}).encode()
    _assert_openai_error(*_raw(server, "POST", "/v1/chat/completions", big), 413)
    # A body announced as huge is refused from the header alone, without reading it.
    url = urllib.parse.urlsplit(server.base_url)
    with socket.create_connection((url.hostname, url.port), timeout=10) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + API_KEY.encode()
                  + b"\r\nContent-Length: 999999999999\r\n\r\n")
        head = s.recv(4096).decode()
    assert head.startswith("HTTP/1.1 413")


def test_auth_is_required_everywhere_but_health(server):
    for method, path in (("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions")):
        status, body = _raw(server, method, path, b"{}", headers={"Authorization": ""})
        _assert_openai_error(status, body, 401)
        assert body["error"]["type"] == "authentication_error"
        status, body = _raw(server, method, path, b"{}", headers={"Authorization": "Bearer nope"})
        _assert_openai_error(status, body, 401)
    status, body = _raw(server, "GET", "/health", headers={"Authorization": ""})
    assert status == 200 and body["status"] == "ok"


def test_unknown_route_and_wrong_method(server):
    _assert_openai_error(*_raw(server, "GET", "/v1/embeddings"), 404)
    _assert_openai_error(*_raw(server, "GET", "/v1/chat/completions"), 405)
    _assert_openai_error(*_raw(server, "DELETE", "/v1/models"), 405)
    _assert_openai_error(*_raw(server, "PATCH", "/v1/completions", b"{}"), 405)


def _raw_bytes(server, data: bytes) -> tuple[int, dict]:
    url = urllib.parse.urlsplit(server.base_url)
    with socket.create_connection((url.hostname, url.port), timeout=10) as s:
        s.sendall(data)
        received = b""
        while chunk := s.recv(4096):
            received += chunk
    head, _, body = received.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_malformed_http_gets_json_errors_too(server):
    _assert_openai_error(*_raw_bytes(server, b"garbage\r\n\r\n"), 400)
    _assert_openai_error(*_raw_bytes(server, b"POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer "
                                     + API_KEY.encode() + b"\r\nContent-Length: -5\r\n\r\n"), 400)
    _assert_openai_error(*_raw_bytes(server, b"POST /v1/completions HTTP/1.1\r\nAuthorization: Bearer "
                                     + API_KEY.encode() + b"\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), 411)


def test_text_that_cannot_be_tokenized_is_400(server):
    lone_surrogate = b'"\\ud800"'  # valid JSON, but no UTF-8 text: a tokenizer cannot take it
    body = b'{"model": "tiny", "max_tokens": 2, "prompt": ' + lone_surrogate + b"}"
    _assert_openai_error(*_raw(server, "POST", "/v1/completions", body), 400, "prompt")
    body = b'{"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": ' + lone_surrogate + b"}]}"
    _assert_openai_error(*_raw(server, "POST", "/v1/chat/completions", body), 400, "messages")


def test_client_that_disconnects_mid_stream_frees_its_slot(server):
    url = urllib.parse.urlsplit(server.base_url)
    # ignore_eos (a vLLM extension) keeps the row busy until max_tokens: only the disconnect ends it.
    body = json.dumps({**CHAT, "max_tokens": 2000, "stream": True, "ignore_eos": True}).encode()
    with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + API_KEY.encode() + b"\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        received = b""
        while received.count(b"data: ") < 2:  # the role chunk, then generated text: it is decoding
            received += sock.recv(4096)
        assert received.startswith(b"HTTP/1.1 200")
        before = _raw(server, "GET", "/health")[1]
        assert before["running"] >= 1
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        health = _raw(server, "GET", "/health")[1]
        if health["running"] == 0:
            break
        time.sleep(0.2)
    assert health["running"] == 0, "slot still held after the client disconnected"
    assert health["cancelled"] > before["cancelled"], "the row ended on its own, not by the disconnect"


def test_server_still_answers_after_all_of_that(client):
    r = client.chat.completions.create(model="tiny", messages=CHAT["messages"], max_tokens=3)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_refused_body_does_not_poison_a_kept_alive_connection(server):
    """A 401 before the body is read must not leave that body to be parsed as the next request."""
    url = urllib.parse.urlsplit(server.base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    body = json.dumps({**CHAT, "messages": [{"role": "user", "content": "GET /v1/models HTTP/1.1\r\n\r\n"}]})
    conn.request("POST", "/v1/chat/completions", body, {"Authorization": "Bearer wrong"})
    first = conn.getresponse()
    first.read()
    assert first.status == 401
    conn.request("GET", "/v1/models", headers={"Authorization": f"Bearer {API_KEY}"})
    second = conn.getresponse()
    assert second.status == 200 and json.loads(second.read())["data"][0]["id"] == "tiny"
    conn.close()
