#!/usr/bin/env python3
"""Does `rlctl serve` (built-in engine) grow with the number of requests it has served?

  PYTHONPATH=. .venv/bin/python bench/serve_memory_bench.py [--requests 10000] [--clients 16]

Starts a real `rlctl serve --engine hf` process on a tiny model (2 layers, hidden 64, built in a
temporary folder), then sends `--requests` requests from `--clients` threads over kept-alive
connections, cycling through every kind of traffic a server sees, good and bad:

  chat, chat streamed, completion (n=2), completion streamed with usage, 400 (bad value),
  401 (wrong key), 404 (unknown model), 413 (body over --max-body-bytes), a client that
  disconnects mid-stream, GET /v1/models

and prints the server process's resident memory (VmRSS, /proc) after the first 100 requests
and then every `--every` requests, with the growth against the 100-request figure. Exit 1 when a
request got an unexpected status, or when the last figure is more than --max-growth (default
10%) above the 100-request one.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

KEY = "bench-key"
MAX_BODY = 64 << 10
CHAT = [{"role": "user", "content": "What is 2 + 2?"}]
# (name, method, path, body, expected status, headers, disconnect mid-stream)
KINDS = [
    ("chat", "POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 4}, 200, {}, False),
    ("chat-stream", "POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 4, "stream": True}, 200, {}, False),
    ("completion-n2", "POST", "/v1/completions", {"prompt": "Once upon", "max_tokens": 4, "n": 2}, 200, {}, False),
    ("completion-stream", "POST", "/v1/completions",
     {"prompt": "abc", "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}}, 200, {}, False),
    ("400", "POST", "/v1/chat/completions", {"messages": CHAT, "temperature": 9}, 400, {}, False),
    ("401", "POST", "/v1/chat/completions", {"messages": CHAT}, 401, {"Authorization": "Bearer wrong"}, False),
    ("404", "POST", "/v1/chat/completions", {"messages": CHAT, "model": "other"}, 404, {}, False),
    ("413", "POST", "/v1/completions", {"prompt": "x" * (MAX_BODY + 1)}, 413, {}, False),
    ("disconnect", "POST", "/v1/chat/completions",
     {"messages": CHAT, "max_tokens": 200, "stream": True, "ignore_eos": True}, 200, {}, True),
    ("models", "GET", "/v1/models", None, 200, {}, False),
]


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def start_server(model: Path) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-c", "import sys; from rlctl.cli.main import main; sys.exit(main())", "serve",
           str(model), "--engine", "hf", "--port", "0", "--served-model-name", "m", "--api-key", KEY,
           "--max-body-bytes", str(MAX_BODY)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    for line in proc.stderr:
        found = re.search(r"on (http://[^ ]+)/v1", line)
        if found:  # keep draining the access log so the server never blocks on a full pipe
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, found.group(1)
    raise RuntimeError(f"the server did not start (exit {proc.wait()})")


class Client:
    """One kept-alive connection, reopened whenever the server (or we) closed it."""

    def __init__(self, host: str, port: int):
        self.host, self.port, self.conn = host, port, None

    def send(self, kind: tuple) -> int:
        _, method, path, body, _, headers, disconnect = kind
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        data = None if body is None else json.dumps({"model": "m", **body}).encode()
        self.conn.request(method, path, data, {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json",
                                               **headers})
        resp = self.conn.getresponse()
        if disconnect:
            resp.read(64)  # the role chunk and a little text: the row is decoding; then hang up
            self.close()
            return resp.status
        resp.read()
        if resp.will_close:
            self.close()
        return resp.status

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def run(base_url: str, total: int, clients: int, on_count) -> list[str]:
    """Send `total` requests from `clients` threads; on_count(n) after every request; returns failures."""
    host, port = base_url.removeprefix("http://").rsplit(":", 1)
    counter, lock, failures = itertools.count(), threading.Lock(), []

    def worker():
        client = Client(host, int(port))
        while (i := next(counter)) < total:
            kind = KINDS[i % len(KINDS)]
            try:
                status = client.send(kind)
            except (OSError, http.client.HTTPException) as e:
                client.close()
                status = f"{type(e).__name__}: {e}"
            with lock:
                if status != kind[4]:
                    failures.append(f"request {i} ({kind[0]}): got {status}, expected {kind[4]}")
                on_count()
        client.close()

    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return failures


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--every", type=int, default=1000, help="print RSS every this many requests")
    ap.add_argument("--max-growth", type=float, default=0.10)
    args = ap.parse_args()
    from rlctl.models.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        build_tiny_model(Path(tmp), layers=2, hidden=64, heads=4, kv_heads=2, seed=0)
        proc, url = start_server(Path(tmp))
        try:
            return measure(proc, url, args)
        finally:
            proc.terminate()
            proc.wait(30)


def measure(proc: subprocess.Popen, url: str, args) -> int:
    marks, done, start = {100} | set(range(args.every, args.requests + 1, args.every)), [0], time.monotonic()
    rss: dict[int, int] = {}

    def on_count():
        done[0] += 1
        if done[0] in marks:
            rss[done[0]] = rss_kib(proc.pid)

    print(f"rlctl serve pid {proc.pid}; RSS before any request: {rss_kib(proc.pid) / 1024:.1f} MiB", flush=True)
    failures = run(url, args.requests, args.clients, on_count)
    wall = time.monotonic() - start
    print(f"{'requests':>9} {'RSS MiB':>9} {'vs 100':>8}")
    for n in sorted(rss):
        print(f"{n:>9} {rss[n] / 1024:>9.1f} {100 * (rss[n] / rss[100] - 1):>+7.1f}%")
    last = max(rss)
    growth = rss[last] / rss[100] - 1
    print(f"{args.requests} requests ({len(KINDS)} kinds in turn) from {args.clients} clients in {wall:.0f} s "
          f"({args.requests / wall:.0f}/s); RSS after {last} is {100 * growth:+.1f}% vs after 100 "
          f"(limit {100 * args.max_growth:+.0f}%)")
    for failure in failures[:10]:
        print("unexpected:", failure)
    return 1 if failures or growth > args.max_growth else 0


if __name__ == "__main__":
    sys.exit(main())
