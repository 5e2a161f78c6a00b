"""JSON over HTTP, standard library only (urllib): the client of the reward services
(rlctl.rewards.remote) and of a SandboxFusion service (rlctl.sandbox.remote).

No HTTP package: the controller must not need one. A request that fails (connection refused, a
5xx, a time-out, an answer that is not JSON) is retried `retries` times with a short back-off;
what still fails raises an `HttpFailure` carrying one line on why.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request

BACKOFF_S = 0.5  # first retry waits this long, then twice as long each time


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


def _snippet(data: bytes) -> str:
    text = data.decode("utf-8", "replace").strip().replace("\n", " ")
    return text[:120] + ("..." if len(text) > 120 else "")
