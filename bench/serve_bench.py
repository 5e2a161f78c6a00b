#!/usr/bin/env python3
"""Built-in server throughput: continuous batching against one-request-at-a-time serving.

  .venv/bin/python bench/serve_bench.py [--sizes tiny,small | --model models/smollm2] [--threads 1] [--requests 32]

For each model size a real `rlctl serve --engine hf` process is started twice: with
--max-concurrency 32 (batched) and --max-concurrency 1 (sequential serving: requests queue and
are decoded one by one). Both get the same burst of 32 concurrent /v1/chat/completions requests
built from ../shared/bench's workload prompts (system + user, 78-126 tokens), 64 new tokens each
with ignore_eos (so both modes generate exactly 32 x 64 tokens), T=1, fp32. Models come from
../shared/bench/tiny_model.py (seed 0) in /tmp/bench-models. `foreign` is the CPU (in cores)
used meanwhile by processes other than this script and its server, from /proc/stat.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED_BENCH = Path(os.environ.get("RLCTL_SHARED", REPO.parent / "shared")) / "bench"
sys.path.insert(0, str(SHARED_BENCH))

import workload as W  # noqa: E402  (../shared/bench/workload.py: the fixed prompts)

NEW_TOKENS = W.MAX_COMPLETION_LENGTH


def _cpu_seconds(pid: int | None = None) -> float:
    """Busy CPU seconds of the whole machine (pid None) or of one process."""
    tick = os.sysconf("SC_CLK_TCK")
    if pid is None:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return (sum(v[:8]) - v[3] - v[4]) / tick
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / tick  # utime + stime


def ensure_model(size: str) -> Path:
    out = Path(f"/tmp/bench-models/{size}")
    if not (out / "model.safetensors").exists():
        import tiny_model

        tiny_model.build(str(out), size, seed=0)
    return out


def start_server(model: Path, concurrency: int, threads: int):
    cmd = [sys.executable, "-c", "import sys; from rlctl.cli.main import main; sys.exit(main())", "serve",
           str(model), "--engine", "hf", "--port", "0", "--served-model-name", "m",
           "--max-concurrency", str(concurrency)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
    for line in proc.stderr:
        found = re.search(r"on (http://[^ ]+)/v1", line)
        if found:
            # Drain the access log in the background so the server never blocks on a full pipe.
            import threading
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, found.group(1)
    raise RuntimeError(f"server for {model} did not start (exit {proc.wait()})")


def chat(base_url: str, messages: list[dict], seed: int) -> tuple[float, int]:
    """One request on its own connection; returns (latency_s, completion_tokens)."""
    url = urllib.parse.urlsplit(base_url)
    body = json.dumps({"model": "m", "messages": messages, "max_tokens": NEW_TOKENS, "temperature": 1.0,
                       "seed": seed, "ignore_eos": True})
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=600)
    conn.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = json.loads(resp.read())
    conn.close()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {data}")
    return time.perf_counter() - t0, data["usage"]["completion_tokens"]


def burst(base_url: str, n: int, pid: int) -> dict:
    rows = W.make_rows()
    busy0, own0, srv0, t0 = _cpu_seconds(), time.process_time(), _cpu_seconds(pid), time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        results = list(pool.map(lambda i: chat(base_url, rows[i % len(rows)]["prompt"], i), range(n)))
    wall = time.perf_counter() - t0
    foreign = ((_cpu_seconds() - busy0) - (time.process_time() - own0) - (_cpu_seconds(pid) - srv0)) / wall
    tokens = sum(t for _, t in results)
    return {"wall_s": wall, "req_s": n / wall, "tok_s": tokens / wall, "tokens": tokens,
            "p50_latency_s": statistics.median(lat for lat, _ in results), "foreign_cores": max(0.0, foreign)}


def run(size: str, concurrency: int, threads: int, requests: int) -> dict:
    """`size`: a tiny_model size, or a model folder (a path with a slash: --model)."""
    proc, url = start_server(Path(size) if "/" in size else ensure_model(size), concurrency, threads)
    try:
        chat(url, W.make_rows()[0]["prompt"], 0)  # warm-up: first-call allocations, lazy imports
        return burst(url, requests, proc.pid)
    finally:
        proc.terminate()
        proc.wait(30)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="tiny,small")
    ap.add_argument("--model", action="append", default=[],
                    help="a model folder to bench instead of the tiny sizes (e.g. models/smollm2); repeatable")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the server")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    print(f"load average before: {os.getloadavg()[0]:.2f} (1 min) on {os.cpu_count()} cores", flush=True)
    results = []
    for size in [str(Path(m).resolve()) for m in args.model] or args.sizes.split(","):
        for mode, concurrency in (("batched", args.requests), ("sequential", 1)):
            r = run(size, concurrency, args.threads, args.requests)
            results.append({"size": Path(size).name, "mode": mode, "threads": args.threads, **r})
            print(f"  {size:5s} {mode:10s} {r['wall_s']:7.2f} s  p50 {r['p50_latency_s']:.2f} s", flush=True)
    print(f"\n{args.requests} concurrent chat requests x {NEW_TOKENS} new tokens, server threads {args.threads}\n")
    print("| size | mode | wall s | req/s | gen tok/s | p50 latency s | speedup | foreign cores |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        base = next(x for x in results if x["size"] == r["size"] and x["mode"] == "sequential")
        print(f"| {r['size']} | {r['mode']} | {r['wall_s']:.2f} | {r['req_s']:.2f} | {r['tok_s']:.0f} | "
              f"{r['p50_latency_s']:.2f} | {r['tok_s'] / base['tok_s']:.2f}x | {r['foreign_cores']:.2f} |")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
