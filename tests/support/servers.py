"""Real servers on loopback for the tests: `rlctl serve` in a child process, and JSON replies for
the small http.server stand-ins some tests run in a thread."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

URL_LINE = re.compile(r"on (http://[^ ]+)/v1")


def send_json(handler, body: dict, status: int = 200) -> None:
    """Answer an http.server request with `body` as JSON."""
    data = json.dumps(body).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class ServerProcess:
    """`rlctl serve` (or another serving `command`, whose log line `url_line` finds the URL in) in a
    child process; `stderr_lines` collects its log for failure messages."""

    def __init__(self, args: list[str], timeout_s: float = 90.0, *, command: str = "serve",
                 url_line: re.Pattern = URL_LINE):
        cmd = [sys.executable, "-c", "import sys; from rlctl.cli.main import main; sys.exit(main())",
               command, *args]
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                                     env={**os.environ, "OMP_NUM_THREADS": "1"})
        self.stderr_lines: list[str] = []
        self.base_url = None
        deadline = time.monotonic() + timeout_s
        for line in self.proc.stderr:
            self.stderr_lines.append(line)
            match = url_line.search(line)
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
