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
          max_samplers: int, max_clients: int | None = None, ready=None) -> int:
    from rlctl.tinker.base import BaseModel
    from rlctl.tinker.http import TinkerServer
    from rlctl.tinker.service import Service
    from rlctl.tinker.wire import proto_module

    proto_module()   # the schema is there before anything heavy starts
    bases = {}
    for name, path in models.items():
        log.info("loading %s (%s)", name, path)
        bases[name] = BaseModel(name, path, sampler_slots=2 * max_samplers)   # room while evicted rows finish
    service = Service(bases, state_dir, max_samplers, max_clients)
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
    log.info("serving the Tinker API for %s on %s; saved states under %s", ", ".join(bases), url, state_dir)
    print(f"TINKER_BASE_URL={url}", flush=True)
    if api_key:
        print(f"TINKER_API_KEY={api_key}", flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        service.futures.stop()
        for base in bases.values():
            base.engine.shutdown()
        server.server_close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0
