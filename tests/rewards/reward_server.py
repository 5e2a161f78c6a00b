"""A small reward service for tests: OpenRLHF's protocol on loopback, in a thread of the test process.

It scores the share of lowercase ASCII letters in each response (query minus its prompt), a dense
reward the tiny random model can learn. `fail_after` makes it answer HTTP 500 from that request on
(a service that died mid-run); `delay_s` makes every answer slow.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def lowercase_share(text: str) -> float:
    return sum("a" <= ch <= "z" for ch in text) / max(len(text), 1)


class RewardService:
    def __init__(self, *, fail_after: int | None = None, delay_s: float = 0.0):
        self.requests: list[dict] = []
        self.fail_after, self.delay_s = fail_after, delay_s
        service = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                service.requests.append(body)
                time.sleep(service.delay_s)
                if service.fail_after is not None and len(service.requests) > service.fail_after:
                    self.send_error(500, "service is down")
                    return
                rewards = [lowercase_share(q[len(p):]) for q, p in zip(body["query"], body["prompts"])]
                data = json.dumps({"rewards": rewards}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/get_reward"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> RewardService:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
