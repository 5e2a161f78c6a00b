"""The agent endpoint: rlctl.api.http's OpenAI-compatible server on loopback, over the agent engine.

Each episode is sealed: it has its own base URL, `http://127.0.0.1:PORT/e/<tag>/v1`, and its own key,
so every call is recorded under the episode that made it, whatever client or process the agent uses.
A tag is a run-wide counter and 16 random bytes: never reused within the run, not guessable. An
episode's key is an HMAC of its tag under a secret the server keeps in memory (never in an
environment): a request without `Authorization: Bearer <that episode's key>` is a 401; with it, but
to an episode that has ended (a helper process an agent left running), a 410, never generated nor
recorded. It listens on 127.0.0.1 only, on a port the system picks.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import itertools
import secrets
import threading

from rlctl.agent.engine import AgentEngine
from rlctl.agent.episodes import CONTEXT_LENGTH
from rlctl.api.api_error import APIError
from rlctl.api.guards import check_bearer
from rlctl.api.http import OpenAIServer

MODEL_NAME = "policy"   # what GET /v1/models lists; chat requests may name any model


class AgentServer(OpenAIServer):
    any_model = True
    quiet = True
    body_limit_source = "the agent endpoint's fixed limit: send less in one call"

    def __init__(self, engine: AgentEngine):
        self._secret = secrets.token_bytes(32)
        self._issued = itertools.count()
        super().__init__(("127.0.0.1", 0), engine, model_name=MODEL_NAME)
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="rlctl-agent-endpoint", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self.server_address[1]

    def new_tag(self) -> str:
        """A fresh episode tag: the counter makes it unique within the run, the random part unguessable."""
        return f"{next(self._issued):x}-{secrets.token_urlsafe(16)}"

    def key(self, tag: str) -> str:
        """The episode's key: only this server (its secret) can make it, and it opens that episode alone."""
        mac = hmac.new(self._secret, tag.encode(), hashlib.sha256).digest()
        return "rlctl-" + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()

    def base_url(self, tag: str) -> str:
        return f"http://127.0.0.1:{self.port}/e/{tag}/v1"

    def scope(self, path: str) -> tuple[str, str]:
        """/e/<tag>/v1/... -> (tag, /v1/...); /e/<tag>/inference/v1/generate likewise."""
        parts = path.split("/", 3)
        if len(parts) < 4 or parts[1] != "e" or not parts[2]:
            raise APIError(404, "no route: the agent endpoint serves /e/<episode>/v1/... (use the base URL "
                                "the episode was given)", code="not_found")
        return parts[2], "/" + parts[3]

    def authorize(self, tag: str, header: str) -> None:
        """401 unless the key is this episode's; 410 when the episode is no longer running."""
        check_bearer(header, hashlib.sha256(self.key(tag).encode()).digest())
        if not self.engine.live(tag):
            raise APIError(410, "this episode has ended; its endpoint takes no more calls", code="episode_ended")

    def refused(self, tag: str, error: APIError) -> None:
        """A call too long for its row (the parser's 400 context_length_exceeded): noted on its episode."""
        if error.code == CONTEXT_LENGTH:
            self.engine.note_refusal(tag, error.code)

    def close(self) -> None:
        self.engine.stop()
        self.shutdown()
        self.server_close()
        self._thread.join(5.0)
