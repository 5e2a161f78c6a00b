"""The reward services' side of HTTP: their URLs checked (reward.<key>), and requests in parallel.

The JSON client itself is rlctl.utils.http (standard library only, shared with the sandbox's
SandboxFusion runner). A request that still fails after its retries comes back from
`map_concurrent` as its `HttpFailure`, which the source turns into that sample's error under
`reward.on_error`.
"""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

from rlctl.errors import ConfigError
from rlctl.utils.http import HttpFailure

PROBE_TIMEOUT_S = 5.0


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
