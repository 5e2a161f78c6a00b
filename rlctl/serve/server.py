"""Start, run and stop the built-in server: bind safely, serve until SIGINT/SIGTERM, drain, exit."""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
import threading
from pathlib import Path

from rlctl.errors import UsageError

log = logging.getLogger("rlctl.serve")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: only trust it if it resolves to loopback addresses alone
        try:
            infos = socket.getaddrinfo(host, None)
        except OSError:
            return False
        return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def check_bind(host: str, api_key: str | None, insecure: bool) -> None:
    """Refuse to expose an unauthenticated model to the network unless asked to in so many words."""
    if not is_loopback(host) and not api_key and not insecure:
        raise UsageError(f"--host {host} exposes the server beyond this machine without an API key",
                         hint="pass --api-key KEY (or RLCTL_API_KEY), or --insecure if you mean it.")


def make_server(engine, host: str, port: int, *, model_name: str, api_key: str | None = None,
                limits: dict | None = None):
    """The HTTP server; `limits` are OpenAIServer's max_body_bytes / read_timeout_s (its defaults otherwise)."""
    from rlctl.api.http import OpenAIServer

    cls = OpenAIServer
    if ":" in host:
        cls = type("OpenAIServer6", (OpenAIServer,), {"address_family": socket.AF_INET6})
    try:
        return cls((host, port), engine, model_name=model_name, api_key=api_key, **(limits or {}))
    except OSError as e:
        raise UsageError(f"cannot listen on {host}:{port}: {e.strerror or e}",
                         hint="pick another --port, or stop what is using it.") from None


def serve_builtin(folder: Path, *, host: str, port: int, model_name: str, api_key: str | None,
                  max_concurrency: int, dtype: str, drain_s: float = 10.0, limits: dict | None = None,
                  prompt_logprobs: int = 0, allow_remote_images: bool = False, lora: dict | None = None,
                  chat_template: Path | None = None) -> int:
    """Load the model, serve until a signal, let running requests finish (up to drain_s), return 0.
    `lora`: {"adapters": [(name, folder)], "slots": N, "max_rank": R} (rlctl.serve.adapters), or None.
    `chat_template`: a checked template file rendering chats instead of the model's own (--chat-template)."""
    from rlctl.models.chat_template import use_template
    from rlctl.serve.engine import Engine
    from rlctl.serve.source import load_model, load_processor_of

    server = make_server(None, host, port, model_name=model_name, api_key=api_key, limits=limits)  # fail fast if taken
    log.info("loading %s", folder)
    try:
        model, tokenizer = load_model(folder, dtype)
        processor = load_processor_of(folder)
        for renderer in (tokenizer, processor):   # a VLM renders with its processor
            use_template(renderer, chat_template)
        adapters = served_adapters(model, model_name, lora) if lora else None
    except BaseException:
        server.server_close()
        raise
    engine = server.engine = Engine(model, tokenizer, max_rows=max_concurrency, processor=processor,
                                    allow_remote_images=allow_remote_images, adapters=adapters)
    server.prompt_logprobs = prompt_logprobs
    stopping = threading.Event()

    def stop(signum, _frame):
        if stopping.is_set():
            return
        stopping.set()
        log.info("%s received: finishing running requests, then exiting", signal.Signals(signum).name)
        threading.Thread(target=server.shutdown, daemon=True).start()

    previous = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    bound_host, bound_port = server.server_address[:2]
    log.info("limits: request bodies up to %d bytes (--max-body-bytes), each request read within %g s "
             "(--read-timeout-s)", server.max_body_bytes, server.read_timeout_s)
    log.info("serving %r (%s, %d context, up to %d sequences per batch) on http://%s:%d/v1", model_name,
             model.device, engine.context_length, max_concurrency, _url_host(bound_host), bound_port)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        engine.shutdown(timeout=drain_s)
        server.wait_idle(timeout=5.0)  # let handlers write the answers the engine just finished
        server.server_close()
        for s, handler in previous.items():
            signal.signal(s, handler)
    log.info("stopped")
    return 0


def served_adapters(model, model_name: str, lora: dict):
    """The --lora adapters checked against the loaded model and put in their slots."""
    from rlctl.serve.adapters import ServedAdapters, check_adapters

    dtype = next(model.parameters()).dtype
    adapters = check_adapters(lora["adapters"], model, model_name, lora["max_rank"], dtype)
    rank = lora["max_rank"] or max([16, *(a.rank for a in adapters)])
    served = ServedAdapters(model, model_name, slots=lora["slots"], max_rank=rank)
    for adapter in adapters:
        served.add(adapter, busy=set())
        log.info("LoRA adapter %r (rank %d) from %s", adapter.name, adapter.rank, adapter.path)
    return served


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host
