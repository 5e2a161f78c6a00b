"""A real `rlctl serve` process on a free loopback port, shared by the HTTP tests of this folder."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

API_KEY = "test-key-123"
URL_LINE = re.compile(r"on (http://[^ ]+)/v1")


class ServerProcess:
    """`rlctl serve` in a child process; `stderr_lines` collects its log for failure messages."""

    def __init__(self, args: list[str], timeout_s: float = 90.0):
        cmd = [sys.executable, "-c", "import sys; from rlctl.cli.main import main; sys.exit(main())",
               "serve", *args]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                                     env={**os.environ, "OMP_NUM_THREADS": "1"})
        self.stderr_lines: list[str] = []
        self.base_url = None
        deadline = time.monotonic() + timeout_s
        for line in self.proc.stderr:
            self.stderr_lines.append(line)
            match = URL_LINE.search(line)
            if match:
                self.base_url = match.group(1)
                break
            if time.monotonic() > deadline:
                break
        if self.base_url is None:
            self.proc.kill()
            raise RuntimeError("server did not start:\n" + "".join(self.stderr_lines))
        # Keep draining stderr so a chatty server never blocks on a full pipe.
        threading.Thread(target=lambda: self.stderr_lines.extend(self.proc.stderr), daemon=True).start()

    def stop(self, sig=signal.SIGTERM, timeout_s: float = 20.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise


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
