"""JSON over HTTP for the reward sources that live elsewhere (an LLM judge, a remote reward service,
a SandboxFusion service for the code reward).

Standard library only (urllib + threads): the controller must not need an HTTP package. A request
that fails (connection refused, a 5xx, a time-out, an answer that is not JSON) is retried
`retries` times with a short back-off; what still fails comes back as an `HttpFailure` carrying
one line on why, which the source turns into that sample's error under `reward.on_error`.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from rlctl.errors import ConfigError

BACKOFF_S = 0.5  # first retry waits this long, then twice as long each time
PROBE_TIMEOUT_S = 5.0


class HttpFailure(Exception):
    """A request that failed after its retries; the message is one line on why."""


def post_json(url: str, payload: dict, *, timeout_s: float, retries: int, headers: dict | None = None,
              timeout_key: str = "reward.timeout_s") -> dict:
    """POST `payload` as JSON and return the decoded JSON answer; HttpFailure after `retries` retries.

    A 4xx other than 408/429 is not retried: sending the same request again cannot help.
    `timeout_key`: the setting a time-out message names ("" when no single key sets it)."""
    body = json.dumps(payload).encode("utf-8")
    why = ""
    for attempt in range(retries + 1):
        if attempt:
            time.sleep(BACKOFF_S * 2 ** (attempt - 1))
        request = urllib.request.Request(url, data=body, method="POST",
                                         headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                text = response.read()
        except urllib.error.HTTPError as e:
            why = f"HTTP {e.code} from {url}: {_snippet(e.read())}"
            if 400 <= e.code < 500 and e.code not in (408, 429):
                break
            continue
        except (TimeoutError, socket.timeout):
            why = f"no answer from {url} within {timeout_key + ' = ' if timeout_key else ''}{timeout_s:g} s"
            continue
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            why = f"{url} unreachable ({'time-out' if isinstance(reason, (TimeoutError, socket.timeout)) else reason})"
            continue
        try:
            return json.loads(text)
        except ValueError:
            why = f"{url} answered with something that is not JSON: {_snippet(text)}"
    tries = f" (after {retries + 1} tries)" if retries else ""
    raise HttpFailure(why + tries)


def map_concurrent(fn, items: list, concurrency: int) -> list:
    """[fn(item) for item in items] with at most `concurrency` calls in flight; exceptions are returned."""
    def safe(item):
        try:
            return fn(item)
        except HttpFailure as e:
            return e

    if len(items) <= 1:
        return [safe(it) for it in items]
    with ThreadPoolExecutor(max_workers=min(concurrency, len(items)), thread_name_prefix="rlctl-reward-http") as pool:
        return list(pool.map(safe, items))


def check_url(url: str, key: str) -> tuple[str, int]:
    """(host, port) of an http(s) URL; ConfigError (exit 2) naming reward.<key> otherwise."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"reward.{key} = {url!r} is not an http:// or https:// URL",
                          hint=f"write e.g. reward.{key} = \"http://127.0.0.1:5000/...\".")
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


def check_reachable(url: str, key: str) -> None:
    """ConfigError (exit 2) before the first step when `url` is no http(s) URL or nothing listens
    at its host and port. Training probes once, when the reward sources start (build_reward)."""
    host, port = check_url(url, key)
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
    except OSError as e:
        raise ConfigError(f"reward.{key}: nothing answers at {host}:{port} ({e.strerror or e})",
                          hint="start the service first, or fix the URL.") from None


def _snippet(data: bytes) -> str:
    text = data.decode("utf-8", "replace").strip().replace("\n", " ")
    return text[:120] + ("..." if len(text) > 120 else "")
