"""The HTTP front of the built-in engine: stdlib ThreadingHTTPServer, one thread per connection.

Handler threads parse and validate, submit to the engine's scheduler and wait on a queue of
events; they never touch the model. Anything a client sends wrong is a 4xx with OpenAI's error
JSON; a client that goes away (mid-stream or while waiting) cancels its rows at the next step.
A client has `read_timeout_s` to send a whole request (line, headers, body), however it trickles
the bytes in: a slowloris holds one thread for that long at most, never the others.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import queue
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from rlctl.api import lora_routes, protocol, responses
from rlctl.api.deadline import DeadlineReader
from rlctl.api.guards import check_bearer, json_object, too_large
from rlctl.api.requests import Request, ServingEngine
from rlctl.api.prompt_logprobs import prompt_logprobs, requested_k
from rlctl.api.api_error import APIError
from rlctl.api.tools import ToolCallStream

log = logging.getLogger("rlctl.serve")
POLL_S = 0.2  # how often a waiting handler checks whether its client is still there
LINGER_S = 2.0  # after refusing a body: read (and drop) it this long so the client sees our answer
DEFAULT_MAX_BODY_BYTES = 4 << 20
DEFAULT_READ_TIMEOUT_S = 30.0


class _ClientGone(Exception):
    pass


class OpenAIServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256  # a burst of clients must not overflow the listen backlog
    prompt_logprobs = 0       # most prompt_logprobs a request may ask for (`rlctl serve --prompt-logprobs`)
    quiet = False             # True: no line per request (the agent endpoint's thousands of calls a step)
    any_model = False         # True: a request may name any model (the agent endpoint's one policy)
    body_limit_source = "rlctl serve --max-body-bytes"   # what sets max_body_bytes, named in a 413

    def __init__(self, address, engine: ServingEngine, *, model_name: str, api_key: str | None = None,
                 max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, read_timeout_s: float = DEFAULT_READ_TIMEOUT_S):
        super().__init__(address, _Handler)
        self.engine, self.model_name = engine, model_name
        # Compare digests, not keys: equal length whatever was sent, so the time says nothing.
        self.api_key_digest = None if api_key is None else hashlib.sha256(api_key.encode("utf-8")).digest()
        self.max_body_bytes, self.read_timeout_s = max_body_bytes, read_timeout_s
        self.created = int(time.time())
        self._active = 0  # handlers with a generation in flight; shutdown waits for them to reply
        self._idle = threading.Condition()

    def track(self, delta: int) -> None:
        with self._idle:
            self._active += delta
            self._idle.notify_all()

    def scope(self, path: str) -> tuple[str, str]:
        """(the tag of the caller a path names, the route inside it): "" and the path itself here; the
        agent endpoint (rlctl.agent.endpoint) serves each episode under its own prefix."""
        return "", path

    def authorize(self, tag: str, header: str) -> None:
        """Raise a 401 unless `header` is `Bearer <key>` with the server's key (the agent endpoint: the
        key of the episode `tag` names, and that episode still running)."""
        check_bearer(header, self.api_key_digest)

    def refused(self, tag: str, error: APIError) -> None:
        """A request of the caller `tag` was answered with `error` (the agent endpoint notes it on the episode)."""

    def wait_idle(self, timeout: float) -> bool:
        with self._idle:
            return self._idle.wait_for(lambda: self._active == 0, timeout)

    def handle_error(self, request, client_address) -> None:
        """A client that resets or drops its connection (lm-evaluation-harness's pool does, between
        requests) is one log line; anything else keeps socketserver's traceback."""
        err = sys.exc_info()[1]
        if isinstance(err, ConnectionError):   # reset, aborted, broken pipe
            log.info("%s closed the connection (%s)", client_address[0], err.strerror or type(err).__name__)
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "rlctl"
    timeout = 300  # per write: a client that stops reading its answer is dropped after this long
    server: OpenAIServer
    deadline: float | None = None  # monotonic time by which the request must have arrived
    expired = False  # the deadline passed while reading
    received = 0  # bytes read from the client for the current request
    responded = False  # a status line went out for the current request
    tag = ""  # who the request is from, by its path (OpenAIServer.scope)
    adapter = ""  # the LoRA adapter the request's `model` named ("" = the base model)

    def setup(self):
        super().setup()
        self.rfile = io.BufferedReader(DeadlineReader(self))

    def handle_one_request(self):
        """One request under the read deadline; a client too slow to send it gets a 408 and is closed.

        The deadline starts when the previous answer is done, so an idle kept-alive connection is
        closed after the same time (silently: it had not started a request)."""
        self.deadline = time.monotonic() + self.server.read_timeout_s
        self.expired, self.received, self.responded = False, 0, False
        super().handle_one_request()
        if self.expired:
            self.close_connection = True
            if not self.server.quiet or self.received:   # the agent endpoint: idle kept-alive connections end quietly
                log.info("%s dropped: no whole request within %gs (%d bytes)", self.client_address[0],
                         self.server.read_timeout_s, self.received)
            if self.received and not self.responded:
                if getattr(self, "request_version", "HTTP/0.9") == "HTTP/0.9":  # cut off in the request line
                    self.request_version, self.requestline = "HTTP/1.1", ""
                message = f"the request did not arrive within {self.server.read_timeout_s:g} s (--read-timeout-s)"
                self._send_json(408, APIError(408, message, code="request_timeout").body(), close=True)

    def _request_read(self) -> None:
        """The whole request is in: writes get the write timeout, not what was left to read."""
        if self.deadline is not None:
            self.deadline = None
            self.connection.settimeout(self.timeout)

    def send_response(self, code, message=None):
        self._request_read()
        self.responded = True
        super().send_response(code, message)

    def handle_expect_100(self):
        """`Expect: 100-continue` with a body over the limit: the 413 goes out before any body."""
        length = self.headers.get("Content-Length", "").strip()
        if length.isdigit() and int(length) > self.server.max_body_bytes:
            self._send_json(413, too_large(int(length), self.server.max_body_bytes, self.server.body_limit_source).body(), close=True)
            return False
        return super().handle_expect_100()

    def log_message(self, fmt, *args):
        if not self.server.quiet:
            log.info("%s %s", self.address_string(), fmt % args)

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    do_PUT = do_PATCH = do_DELETE = do_OPTIONS = lambda self: self._dispatch(self.command)

    def send_error(self, code, message=None, explain=None):
        """The stdlib's own rejections (bad request line, unknown verb) also get OpenAI JSON."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # an unparsable request line: answer as HTTP/1.1 anyway
            self.request_version = "HTTP/1.1"
        body = APIError(code, message or explain or "bad request",
                        type="invalid_request_error" if code < 500 else "server_error").body()
        self._send_json(code, body, close=True)

    def _dispatch(self, method: str) -> None:
        self._body_read = False
        try:
            self._route(method, self.path.split("?", 1)[0].rstrip("/") or "/")
        except APIError as e:
            self.server.refused(self.tag, e)
            # An unread body would be parsed as the next request on this connection: close it.
            unread = not self._body_read and self.headers.get("Content-Length", "0").strip() not in ("", "0")
            chunked = "chunked" in self.headers.get("Transfer-Encoding", "").lower()
            self._send_json(e.status, e.body(), close=unread or chunked or e.status in (411, 413))
            if unread or chunked:
                self._linger()
        except (_ClientGone, BrokenPipeError, ConnectionResetError, socket.timeout):
            self.close_connection = True
        except Exception:  # a bug: keep serving, tell the client it was us
            log.exception("internal error on %s %s", method, self.path)
            body = APIError(500, "internal server error", type="server_error").body()
            self._send_json(500, body, close=True)

    def _route(self, method: str, path: str) -> None:
        if path == "/health":
            self._only(method, "GET")
            self._send_json(200, {"status": "ok", **self.server.engine.load()})
            return
        self.tag, path = self.server.scope(path)
        self.server.authorize(self.tag, self.headers.get("Authorization", ""))
        if path == "/inference/v1/generate" and hasattr(self.server.engine, "generate_ids"):
            self._only(method, "POST")   # vLLM's token endpoint: token ids in, token ids and log-probs out
            self._send_json(200, self.server.engine.generate_ids(self._read_json(), self.tag))
            return
        if path == "/v1/models" or path.startswith("/v1/models/"):   # the base model and its LoRA adapters
            self._only(method, "GET")
            self._send_json(200, lora_routes.models_answer(self.server, self._model_card(), path))
            return
        if path in lora_routes.ROUTES:   # vLLM's /v1/load_lora_adapter, /v1/unload_lora_adapter
            self._only(method, "POST")
            self._send_json(200, lora_routes.handle(self.server.engine, path, self._read_json()),
                            content_type="text/plain; charset=utf-8")
            return
        if path in ("/v1/chat/completions", "/v1/completions"):
            self._only(method, "POST")
            body = self._read_json()
            self.adapter = "" if self.server.any_model else lora_routes.adapter_of(body, self.server)
            engine, max_n = self.server.engine, self.server.engine.max_rows
            parsed = (protocol.parse_chat(body, engine, max_n) if path.endswith("chat/completions")
                      else protocol.parse_completion(body, engine, max_n))
            k = requested_k(body, self.server.prompt_logprobs) if parsed.kind == "completion" else 0
            if k and (parsed.stream or self.adapter):
                raise APIError(400, "'prompt_logprobs' is answered only " + ("for the base model" if self.adapter
                                                                            else "without 'stream'"), param="prompt_logprobs")
            if k:
                parsed.prompt_logprobs = [prompt_logprobs(engine, p, k) for p in parsed.prompts
                                          for _ in range(parsed.params.n)]
            self._generate(parsed)
            return
        if path == "/v1/responses":
            self._only(method, "POST")
            responses.answer(self, self._read_json())   # translated to the chat path (rlctl.api.responses)
            return
        raise APIError(404, f"no route {method} {path}", code="not_found")

    # ---- request plumbing ---------------------------------------------------------------------
    def _only(self, method: str, allowed: str) -> None:
        if method != allowed:
            raise APIError(405, f"use {allowed} for {self.path}", code="method_not_allowed")

    def _read_json(self) -> dict:
        length = self.headers.get("Content-Length")
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked" or length is None:
            raise APIError(411, "send the body with a Content-Length header", code="length_required")
        try:
            length = int(length)
        except ValueError:
            length = -1
        if length < 0:
            raise APIError(400, "Content-Length must be a non-negative integer", code="bad_content_length")
        if length > self.server.max_body_bytes:
            raise too_large(length, self.server.max_body_bytes, self.server.body_limit_source)
        raw = self.rfile.read(length)
        if len(raw) < length:
            raise _ClientGone()
        self._body_read = True
        self._request_read()
        return json_object(raw)

    def _linger(self) -> None:
        """After refusing a request whose body we did not read: drop what the client still sends,
        for up to LINGER_S, before closing. Closing with unread bytes makes the kernel answer with
        a reset, which can destroy our error answer before the client reads it."""
        try:
            self.connection.shutdown(socket.SHUT_WR)
            self.deadline = time.monotonic() + LINGER_S
            while self.rfile.read1(1 << 16):
                pass
        except OSError:  # TimeoutError included: the client kept sending; close anyway
            pass
        finally:
            self.deadline, self.expired = None, False

    def _model_card(self) -> dict:
        return {"id": self.server.model_name, "object": "model", "created": self.server.created,
                "owned_by": "rlctl", "max_model_len": self.server.engine.context_length}

    def _send_json(self, status: int, body: dict | str, *, close: bool = False,
                   content_type: str = "application/json") -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            if close:
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError, socket.timeout):
            self.close_connection = True

    # ---- generation ---------------------------------------------------------------------------
    def _generate(self, parsed: protocol.ParsedRequest, reply=None) -> None:   # reply(requests, events)
        events: queue.Queue = queue.Queue()
        n = parsed.params.n
        visions = parsed.visions or [None] * len(parsed.prompts)
        requests = [Request(p, parsed.params, events, index_base=i * n, vision=v, tag=self.tag, adapter=self.adapter)
                    for i, (p, v) in enumerate(zip(parsed.prompts, visions))]
        self.server.track(+1)
        try:
            for request in requests:
                if not self.server.engine.submit(request):
                    if self.server.engine.stopping:
                        raise APIError(503, "the server is shutting down", type="server_error")
                    raise APIError(429, "the server is busy (request queue full); retry later",
                                   type="server_error", code="server_busy")
            if reply is not None:
                reply(requests, events)
            elif parsed.stream:
                self._stream(parsed, requests, events)
            else:
                self._collect(parsed, requests, events)
        finally:
            for request in requests:  # no-op for finished rows; frees the slots of abandoned ones
                request.cancel()
            self.server.track(-1)

    def _next_event(self, events: queue.Queue):
        while True:
            try:
                return events.get(timeout=POLL_S)
            except queue.Empty:
                if self._client_gone():
                    raise _ClientGone() from None

    def _client_gone(self) -> bool:
        """A readable socket with nothing to read means the peer closed it."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _collect(self, parsed, requests, events) -> None:
        total = len(requests) * parsed.params.n
        texts, finish, tokens = [""] * total, [None] * total, [0] * total
        while any(f is None for f in finish):
            ev = self._next_event(events)
            if ev.error:
                raise APIError(ev.status, ev.error, type="server_error")
            texts[ev.index] += ev.text
            tokens[ev.index] = ev.completion_tokens
            finish[ev.index] = ev.finish_reason
        use = protocol.usage(sum(len(r.prompt_ids) for r in requests), sum(tokens))
        rid = protocol.new_id(parsed.kind)
        self._send_json(200, protocol.response(parsed.kind, rid, self.adapter or self.server.model_name,
                                               list(zip(texts, finish)), use, parsed.tools, parsed.prompt_logprobs))

    def _stream(self, parsed, requests, events) -> None:
        kind, model, rid = parsed.kind, self.adapter or self.server.model_name, protocol.new_id(parsed.kind)
        total = len(requests) * parsed.params.n
        self._start_stream()
        if kind == "chat":
            for i in range(total):
                self._sse(protocol.chunk(kind, rid, model, i, None, None, role=True))
        tokens, done = [0] * total, 0
        calls = [ToolCallStream() for _ in range(total)] if parsed.tools and parsed.tools.parse else None
        while done < total:
            ev = self._next_event(events)
            if ev.error:
                self._sse(APIError(ev.status, ev.error, type="server_error").body())
                break
            tokens[ev.index] = ev.completion_tokens
            done += ev.finish_reason is not None
            if calls is None:
                self._sse(protocol.chunk(kind, rid, model, ev.index, ev.text, ev.finish_reason))
            else:
                self._stream_tools(calls[ev.index], rid, ev)
        if parsed.include_usage:
            use = protocol.usage(sum(len(r.prompt_ids) for r in requests), sum(tokens))
            self._sse(protocol.usage_chunk(kind, rid, model, use))
        self.wfile.write(b"data: [DONE]\n\n")

    def _start_stream(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")  # the stream ends when we close the socket
        self.close_connection = True
        self.end_headers()

    def _stream_tools(self, stream: ToolCallStream, rid: str, ev) -> None:
        """Content while no call has started; at the end the held-back rest, as tool_calls or content."""
        model = self.adapter or self.server.model_name
        text = stream.push(ev.text)
        if ev.finish_reason is None:
            if text:
                self._sse(protocol.chunk("chat", rid, model, ev.index, text, None))
            return
        rest, tool_calls, finish = stream.finish(ev.finish_reason)
        if text + rest:
            self._sse(protocol.chunk("chat", rid, model, ev.index, text + rest, None))
        for k, call in enumerate(tool_calls):
            self._sse(protocol.chunk("chat", rid, model, ev.index, None, None, tool_call=(k, call)))
        self._sse(protocol.chunk("chat", rid, model, ev.index, None, finish))

    def _sse(self, obj: dict) -> None:
        self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
