"""Batch generation for `rlctl eval`: in-process with the built-in engine, or through any
OpenAI-compatible server (the vLLM / SGLang server `rlctl serve` would start).

Both take prompts as token ids (rendered once, exactly as training renders them) and return,
per prompt, n `Sample`s in choice order. Every prompt gets its own seed, so a run is reproducible
however the engine batches it.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import http.client
import json
import logging
import queue
import subprocess
import sys
import time
import urllib.parse
from dataclasses import dataclass

from rlctl.errors import UsageError, WorkerDiedError
from rlctl.api.requests import Request, SamplingParams
from rlctl.serve.engine import Engine

log = logging.getLogger("rlctl.eval")


@dataclass(frozen=True)
class Sample:
    text: str
    finish_reason: str
    tokens: int


def generate_local(model, tokenizer, prompt_ids: list[list[int]], params: list[SamplingParams], *,
                   max_concurrency: int = 32, progress=None, visions: list | None = None,
                   processor=None) -> list[list[Sample]]:
    """All prompts through one continuous-batching engine; `progress(done, total)` per prompt.
    `visions`: per prompt None or its image arrays (a vision-language model with its `processor`)."""
    engine = Engine(model, tokenizer, max_rows=max_concurrency, max_waiting=len(prompt_ids) + 1, processor=processor)
    visions = visions or [None] * len(prompt_ids)
    events: queue.Queue = queue.Queue()
    n = max(p.n for p in params)
    try:
        for i, (ids, p) in enumerate(zip(prompt_ids, params)):
            engine.submit(Request(ids, p, events, index_base=i * n, vision=visions[i]))
        texts, results, left = {}, {}, [p.n for p in params]
        while len(results) < sum(p.n for p in params):
            ev = events.get()
            if ev.error:
                raise WorkerDiedError(f"generation failed: {ev.error}")
            texts[ev.index] = texts.get(ev.index, "") + ev.text
            if ev.finish_reason:
                results[ev.index] = Sample(texts[ev.index], ev.finish_reason, ev.completion_tokens)
                left[ev.index // n] -= 1
                if progress and left[ev.index // n] == 0:
                    progress(sum(1 for x in left if x == 0), len(prompt_ids))
    finally:
        engine.shutdown(timeout=1.0)
    return [[results[i * n + j] for j in range(p.n)] for i, p in enumerate(params)]


def generate_remote(base_url: str, model_name: str, prompt_ids: list[list[int]], params: list[SamplingParams],
                    *, api_key: str | None = None, concurrency: int = 32, progress=None) -> list[list[Sample]]:
    """POST one /v1/completions per prompt (token-id prompt, n choices), `concurrency` at a time."""
    url = urllib.parse.urlsplit(base_url)
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"

    def one(i: int) -> list[Sample]:
        p = params[i]
        body = {"model": model_name, "prompt": prompt_ids[i], "max_tokens": p.max_tokens, "n": p.n,
                "temperature": p.temperature, "top_p": p.top_p, "seed": p.seed}
        if p.stop:
            body["stop"] = list(p.stop)
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=3600)
        try:
            conn.request("POST", "/v1/completions", json.dumps(body), headers)
            resp = conn.getresponse()
            data = json.loads(resp.read() or b"{}")
        finally:
            conn.close()
        if resp.status != 200:
            message = data.get("error", {}).get("message", data) if isinstance(data, dict) else data
            raise WorkerDiedError(f"the engine answered HTTP {resp.status} to prompt {i}: {message}")
        choices = sorted(data["choices"], key=lambda c: c["index"])
        # Servers report completion tokens per request, not per choice: split them evenly.
        per_choice = data.get("usage", {}).get("completion_tokens", 0) // max(1, len(choices))
        return [Sample(c["text"], c.get("finish_reason") or "length", per_choice) for c in choices]

    out: list[list[Sample] | None] = [None] * len(prompt_ids)
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        futures = {pool.submit(one, i): i for i in range(len(prompt_ids))}
        for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
            out[futures[future]] = future.result()
            if progress:
                progress(done, len(prompt_ids))
    return out


@contextlib.contextmanager
def external_server(argv: list[str], base_url: str, *, startup_timeout_s: float = 900.0, env: dict | None = None):
    """Start an engine's server (its logs go to our stderr), wait for /health, stop it afterwards."""
    child = subprocess.Popen(argv, stdout=sys.stderr, start_new_session=True, env=env)
    try:
        _wait_healthy(child, base_url, startup_timeout_s)
        yield base_url
    finally:
        if child.poll() is None:
            child.terminate()
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


def _wait_healthy(child: subprocess.Popen, base_url: str, timeout_s: float) -> None:
    url = urllib.parse.urlsplit(base_url)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise UsageError(f"the engine server exited with code {child.returncode} before it was ready",
                             hint="see its log above.")
        conn = http.client.HTTPConnection(url.hostname, url.port, timeout=5)
        try:
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        finally:
            conn.close()
        time.sleep(1.0)
    raise UsageError(f"the engine server was not ready within {timeout_s:g} s")
