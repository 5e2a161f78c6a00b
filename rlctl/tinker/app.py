"""Start `rlctl tinker`: resolve the base models, bind, serve until SIGINT/SIGTERM."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path

from rlctl.errors import UsageError

log = logging.getLogger("rlctl.tinker")


def parse_models(models: list[str]) -> dict[str, Path]:
    """`--model` words -> {name clients send: local folder}. `NAME=PATH` serves a folder under a
    hub-style name (tinker-cookbook picks its chat renderer by the name); a bare folder's name is
    its path, which is also what the SDK's get_tokenizer loads offline."""
    from rlctl.models.hub import resolve_model

    out: dict[str, Path] = {}
    for word in models:
        name, _, path = word.rpartition("=") if "=" in word else (word, "", word)
        source = resolve_model(path, key="--model")
        if source.folder is None:
            raise UsageError(f"--model {path}: rlctl tinker needs the model on disk",
                             hint=f"fetch it first (`rlctl model get NAME DIR` or the hub), then --model {path}=DIR")
        out[name or (str(source.folder.resolve()) if source.where == "local" else path)] = source.folder
    return out


def serve(models: dict[str, Path], *, host: str, port: int, api_key: str | None, state_dir: Path,
          max_samplers: int, max_clients: int | None = None, address: str | None = None,
          cpus: int | None = None) -> int:
    """Serve until SIGINT/SIGTERM. With `address`, the model side runs on that Ray cluster
    (rlctl.tinker.remote) and this process is the HTTP front."""
    from rlctl.tinker.service import build_service

    if not address:
        service = build_service(models, state_dir, max_samplers, max_clients)
        try:
            return _serve_http(service, models, host, port, api_key, state_dir)
        finally:
            service.close()
    from rlctl.runtime.ray_env import ray_session
    from rlctl.tinker.remote import remote_service

    with ray_session(address) as session, remote_service(session, models, state_dir, max_samplers, max_clients,
                                                         cpus) as service:
        return _serve_http(service, models, host, port, api_key, state_dir)


def _serve_http(service, models: dict[str, Path], host: str, port: int, api_key: str | None, state_dir: Path) -> int:
    from rlctl.tinker.http import TinkerServer

    try:
        server = TinkerServer((host, port), service, api_key)
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}", hint="pick another --port") from None
    stop = threading.Event()

    def on_signal(signum, _frame):
        if not stop.is_set():
            stop.set()
            threading.Thread(target=server.shutdown, daemon=True).start()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    bound = server.server_address
    url = f"http://{'[' + bound[0] + ']' if ':' in bound[0] else bound[0]}:{bound[1]}"
    log.info("serving the Tinker API for %s on %s; saved states under %s", ", ".join(models), url, state_dir)
    print(f"TINKER_BASE_URL={url}", flush=True)
    if api_key:
        print(f"TINKER_API_KEY={api_key}", flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0
