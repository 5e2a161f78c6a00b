"""`rlctl tinker --address`: the server's model side on a Ray cluster.

The server process joins the cluster as `rlctl train --address` does (rlctl.runtime.ray_env) and
starts one actor there, `ServiceHost`, holding what an in-process server holds: the base models,
the training clients' worker and the sampling engines (rlctl.tinker.service.Service). This process
keeps the HTTP front and forwards each route's call to the actor (`RemoteService`: the same
methods). Long polls (retrieve_future) and waits for an engine's thread happen in the actor's
threads, so it takes many calls at once. Files are the actor's: the --model folders and
--state-dir are paths on the node it runs on (the same paths on every node, or shared storage).
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Iterator

from rlctl.errors import UsageError
from rlctl.tinker.wire import TinkerError

log = logging.getLogger("rlctl.tinker")
HOST_CALLS = 512          # calls the actor serves at once: each HTTP thread's long poll holds one
START_TIMEOUT_S = 600.0   # placing the actor, importing torch and loading every base model


class ServiceHost:
    """The Ray actor: a Service built on its node; `call` runs one of its methods by name."""

    def __init__(self, models: dict[str, str], state_dir: str, max_samplers: int, max_clients: int | None):
        from rlctl.tinker.service import build_service

        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
        self.service = build_service({k: Path(v) for k, v in models.items()}, Path(state_dir), max_samplers,
                                     max_clients)

    def where(self) -> str:
        import ray

        return ray.util.get_node_ip_address()

    def call(self, name: str, args: tuple):
        """("ok", result) or ("error", message, status, category): a TinkerError crosses as its
        fields (the exception's own pickling would drop status and category)."""
        try:
            return ("ok", getattr(self.service, name)(*args))
        except TinkerError as e:
            return ("error", e.message, e.status, e.category)

    def close(self) -> None:
        self.service.close()


class RemoteService:
    """Service's methods, each one call of the actor."""

    def __init__(self, actor):
        self._actor = actor

    def __getattr__(self, name: str):
        import ray

        def call(*args):
            try:
                kind, *rest = ray.get(self._actor.call.remote(name, args))
            except ray.exceptions.RayError as e:   # the actor died or the cluster went away: one line
                raise TinkerError(f"the model host on the Ray cluster failed: {_gist(e)}", status=500,
                                  category="server") from None
            if kind == "error":
                raise TinkerError(rest[0], status=rest[1], category=rest[2])
            return rest[0]
        return call


@contextlib.contextmanager
def remote_service(session, models: dict[str, Path], state_dir: Path, max_samplers: int, max_clients: int | None,
                   cpus: int | None) -> Iterator[RemoteService]:
    """Start the ServiceHost actor in the joined cluster (`session`: rlctl.runtime.ray_env.RaySession)
    with `cpus` cores (default: the largest node's); stop it on the way out."""
    import ray

    from rlctl.runtime.worker_group import rank_env

    cpus = cpus or _largest_node_cpus()
    host = ray.remote(ServiceHost).options(num_cpus=cpus, max_concurrency=HOST_CALLS, name=None,
                                           runtime_env={"env_vars": rank_env(cpus)})
    actor = host.remote({k: str(v.resolve()) for k, v in models.items()}, str(state_dir.resolve()), max_samplers,
                        max_clients)
    try:
        ready, _ = ray.wait([actor.where.remote()], timeout=START_TIMEOUT_S)
        if not ready:
            raise UsageError(f"the Ray cluster at {session.address} placed no model host with {cpus} CPUs in "
                             f"{START_TIMEOUT_S:.0f} s", hint="pass --cpus with what one node has free")
        try:
            node = ray.get(ready[0])
        except ray.exceptions.RayError as e:   # the actor's own start failure: a model that does not load there
            raise UsageError(f"the model host did not start on the Ray cluster at {session.address}: "
                             f"{_gist(getattr(e, 'cause', None) or e)}",
                             hint="--model folders and --state-dir must be paths on the cluster's nodes") from None
        log.info("model host on the Ray cluster at %s: node %s, %d CPUs", session.address, node, cpus)
        yield RemoteService(actor)
    finally:
        with contextlib.suppress(Exception):
            ray.get(actor.close.remote(), timeout=30)
        ray.kill(actor)


def _largest_node_cpus() -> int:
    import ray

    return max(1, int(max((n.get("Resources", {}).get("CPU", 0) for n in ray.nodes() if n.get("Alive")), default=1)))


def _gist(err: BaseException) -> str:
    """The line of a Ray error that says what went wrong (its text is a traceback)."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(err).__name__
