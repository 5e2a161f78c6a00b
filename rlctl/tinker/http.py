"""The HTTP front: the SDK's routes under /api/v1 on a stdlib ThreadingHTTPServer.

Handler threads parse, answer discovery routes at once and hand model work to the worker; a
retrieve_future long-polls (up to POLL_S) so the SDK's polling loop does not spin. Errors go back
as {"error": ..., "category": "user"|"server"}: on the route itself (400/404, which the SDK raises
at once) or, for work that fails later, as the future's result (the SDK's RequestFailedError).
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from rlctl.api.guards import key_matches
from rlctl.tinker.futures import Reply
from rlctl.tinker.wire import PROTO, TinkerError, decode_forward_backward

log = logging.getLogger("rlctl.tinker")
POLL_S = 40.0                  # a retrieve_future waits this long before "try_again" (the SDK gives up on one after 45 s)
MAX_BODY = 512 << 20           # forward_backward bodies of long batches are large

# Answered at once, without the worker: the SDK's session bookkeeping. Telemetry is accepted and
# dropped (nothing leaves the machine); config flags keep the SDK on plain httpx and API keys.
CLIENT_CONFIG = {"pjwt_auth_enabled": False, "use_pyqwest_transport": False, "proto_compress_fwdbwd": False,
                 "sample_use_retrieve_futures": False, "custom_loss_server_side": False,
                 "sample_join_sampling_session": False}
STATIC = {
    "/api/v1/client/config": CLIENT_CONFIG,
    "/api/v1/client/dynamic_config": {},
    "/api/v1/session_heartbeat": {"type": "session_heartbeat"},
    "/api/v1/telemetry": {"status": "accepted"},
    "/api/v1/cancel_future": {},
}


class TinkerServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(self, address, service, api_key: str | None):
        """`service`: rlctl.tinker.service.Service, or its stand-in for one on a Ray cluster
        (rlctl.tinker.remote.RemoteService): the same methods."""
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)
        self.service = service
        self.key_digest = None if not api_key else hashlib.sha256(api_key.encode()).digest()

    def post_routes(self) -> dict:
        s = self.service
        return {"/api/v1/create_session": s.create_session, "/api/v1/create_model": s.create_model,
                "/api/v1/get_info": s.get_info, "/api/v1/optim_step": s.optim_step,
                "/api/v1/save_weights": s.save_weights, "/api/v1/load_weights": s.load_weights,
                "/api/v1/save_weights_for_sampler": s.save_weights_for_sampler,
                "/api/v1/create_sampling_session": s.create_sampling_session, "/api/v1/asample": s.asample}


class _Handler(BaseHTTPRequestHandler):
    server: TinkerServer
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        log.debug("%s %s", self.address_string(), fmt % args)

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        try:
            body = self._read_body()
            path = self.path.split("?", 1)[0]
            if path != "/api/v1/healthz":
                self._authorize()
            self._send(200, self._route(method, path, body))
        except TinkerError as e:
            self._send(e.status, Reply(e.body()))
        except Exception as e:   # a bug: this request fails, the server goes on
            log.exception("%s %s failed", method, self.path)
            self._send(500, Reply({"error": f"internal error: {type(e).__name__}: {e}", "category": "server"}))

    def _route(self, method: str, path: str, body: bytes) -> Reply:
        s = self.server.service
        if method == "GET":
            if path == "/api/v1/healthz":    # the sampling engines' load: the SDK reads only "status"
                return Reply({"status": "ok", **s.load()})
            if path == "/api/v1/get_server_capabilities":
                return Reply(s.capabilities())
            if path.startswith("/api/v1/samplers/"):
                return Reply(s.get_sampler(path.rsplit("/", 1)[1]))
        elif path == "/api/v1/forward_backward":
            return Reply(s.forward_backward(decode_forward_backward(body, self.headers.get("Content-Encoding"))))
        elif path == "/api/v1/retrieve_future":
            return self._retrieve(_json(body))
        elif path in STATIC:
            return Reply(STATIC[path])
        elif path.startswith("/api/v1/sessions/") and path.endswith("/finish"):   # ServiceClient.close
            return Reply(s.finish_session(path.split("/")[-2]))
        elif path in self.server.post_routes():
            return Reply(self.server.post_routes()[path](_json(body)))
        raise TinkerError(f"rlctl tinker does not serve {method} {path} (docs/tinker.md lists what it serves)", status=404)

    def _retrieve(self, body: dict) -> Reply:
        request_id = str(body.get("request_id", ""))
        result = self.server.service.wait(request_id, POLL_S)
        if result is None:
            return Reply({"type": "try_again", "request_id": request_id, "queue_state": "active"})
        if isinstance(result, TinkerError):
            return Reply(result.body())
        return result

    def _authorize(self) -> None:
        digest = self.server.key_digest
        if digest is None:
            return
        if not key_matches(self.headers.get("X-API-Key", ""), digest):
            raise TinkerError("missing or wrong API key: set TINKER_API_KEY to the key rlctl tinker printed", status=401)

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY:
            raise TinkerError(f"request body of {length} bytes is over the {MAX_BODY} limit: send fewer datums per call",
                              status=413)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, reply: Reply) -> None:
        data = reply.body if reply.content_type == PROTO else json.dumps(reply.body).encode()
        self.send_response(status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def _json(body: bytes) -> dict:
    try:
        parsed = json.loads(body or b"{}")
    except ValueError as e:
        raise TinkerError(f"the request body is not JSON ({e})") from None
    if not isinstance(parsed, dict):
        raise TinkerError("the request body is not a JSON object")
    return parsed
