"""The agent endpoint: rlctl.api.http's OpenAI-compatible server on loopback, over the agent engine.

Each episode has its own base URL, `http://127.0.0.1:PORT/e/<tag>/v1`, so every call is recorded
under the episode that made it, whatever client or process the agent uses. One fresh random key
per run: a request without `Authorization: Bearer <key>` is a 401, a tag that names no running
episode a 410. It listens on 127.0.0.1 only, on a port the system picks.
"""

from __future__ import annotations

import secrets
import threading

from rlctl.agent.engine import AgentEngine
from rlctl.api.api_error import APIError
from rlctl.api.http import OpenAIServer

MODEL_NAME = "policy"   # what GET /v1/models lists; chat requests may name any model


class AgentServer(OpenAIServer):
    any_model = True
    quiet = True

    def __init__(self, engine: AgentEngine):
        self.key = secrets.token_urlsafe(24)
        super().__init__(("127.0.0.1", 0), engine, model_name=MODEL_NAME, api_key=self.key)
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="rlctl-agent-endpoint", daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        return self.server_address[1]

    def base_url(self, tag: str) -> str:
        return f"http://127.0.0.1:{self.port}/e/{tag}/v1"

    def scope(self, path: str) -> tuple[str, str]:
        """/e/<tag>/v1/... -> (tag, /v1/...); /e/<tag>/inference/v1/generate likewise."""
        parts = path.split("/", 3)
        if len(parts) < 4 or parts[1] != "e" or not parts[2]:
            raise APIError(404, "no route: the agent endpoint serves /e/<episode>/v1/... (use the base URL "
                                "the episode was given)", code="not_found")
        return parts[2], "/" + parts[3]

    def close(self) -> None:
        self.engine.stop()
        self.shutdown()
        self.server_close()
        self._thread.join(5.0)
