"""`rlctl tinker`: the Tinker training API for the official `tinker` SDK, on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from rlctl.cli.common import flag


def tinker(
    model: List[str] = typer.Option(..., "--model", help="A base model clients may train: a local folder, a cached "
                                    "hub id, or NAME=FOLDER to serve a folder under a hub-style name. Repeatable."),
    host: str = typer.Option("127.0.0.1", help="Address to bind; other than loopback needs --api-key or --insecure."),
    port: int = typer.Option(8765, min=0, max=65535, help="Port to listen on (0 = any free port)."),
    api_key: Optional[str] = typer.Option(None, envvar="RLCTL_API_KEY",
                                          help="Require this X-API-Key (clients: TINKER_API_KEY; must start with tml-)."),
    address: Optional[str] = typer.Option(None, help="Join a Ray cluster ('auto', 'host:port', 'ray://host:port') and "
                                          "run the models there; this process serves HTTP."),
    cpus: Optional[int] = typer.Option(None, min=1, help="With --address: CPUs the model host takes on one node "
                                       "(default: the largest node's)."),
    state_dir: Path = typer.Option(Path("tinker-state"), help="Where save_state / save_weights_for_sampler write."),
    max_samplers: int = typer.Option(32, min=1, help="Sampling clients' weight snapshots kept; older ones are evicted."),
    max_clients: Optional[int] = typer.Option(None, min=1, help="Training clients kept (adapter + optimizer state); "
                                              "one more evicts the least recently used. Default: no limit."),
    insecure: bool = flag("--insecure", help="Allow a non-loopback --host without an API key."),
) -> None:
    """Serve the Tinker API (the `tinker` SDK's routes) with LoRA training clients and samplers.

    Point the SDK at it with TINKER_BASE_URL=http://127.0.0.1:8765 and TINKER_API_KEY=tml-<anything>
    (or the --api-key value).

    Example: rlctl tinker --model models/smollm2 --port 8765
    """
    from rlctl.errors import UsageError
    from rlctl.serve.server import check_bind
    from rlctl.tinker.app import parse_models, serve

    if cpus is not None and not address:
        raise UsageError("--cpus applies only with --address (the model host's share of a Ray node)")
    if api_key is not None and not api_key.startswith("tml-"):
        raise UsageError("--api-key must start with 'tml-': the tinker SDK refuses any other key")
    check_bind(host, api_key, insecure)
    raise typer.Exit(serve(parse_models(model), host=host, port=port, api_key=api_key, state_dir=state_dir,
                           max_samplers=max_samplers, max_clients=max_clients, address=address, cpus=cpus))


def register(app: typer.Typer) -> None:
    app.command("tinker")(tinker)
