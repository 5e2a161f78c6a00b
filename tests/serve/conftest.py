"""A real `rlctl serve` process on a free loopback port, shared by the HTTP tests of this folder."""

from __future__ import annotations

import signal

import pytest
from support.servers import ServerProcess

API_KEY = "test-key-123"


@pytest.fixture(scope="session")
def server(tiny_model_dir):
    """Built-in engine, API key required, small batch (8 rows) so bursts also exercise the queue."""
    srv = ServerProcess([str(tiny_model_dir), "--engine", "hf", "--port", "0", "--api-key", API_KEY,
                         "--served-model-name", "tiny", "--max-concurrency", "8"])
    yield srv
    code = srv.stop(signal.SIGTERM)
    assert code == 0, "server did not shut down cleanly on SIGTERM:\n" + "".join(srv.stderr_lines[-20:])


@pytest.fixture()
def client(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture()
def start_server():
    """Start extra `rlctl serve` processes for one test; any still running are killed afterwards."""
    started: list[ServerProcess] = []

    def start(args: list[str]) -> ServerProcess:
        started.append(ServerProcess(args))
        return started[-1]

    yield start
    for srv in started:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()
