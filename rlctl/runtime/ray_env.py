"""Ray's lifecycle: an embedded local instance by default, or joining a running cluster.

`ray_session()` is the only place rlctl starts or stops Ray. It is a context manager so Ray is
shut down on every way out (success, an error, Ctrl-C): worker groups are killed first, then the
embedded instance (raylet, GCS, object store) is stopped, so no process outlives the command.
Ray is imported here lazily: commands that do not train never pay its ~5 s start.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from rlctl.errors import EXIT_TERMINATED, Interrupted, UsageError
from rlctl.utils.interrupts import safe_point

# Local runs: no usage-stats prompt or upload, no token auth between our own processes, and no
# idle workers prestarted for the driver (one per CPU, ~80 MB each and CPU time during start-up):
# rlctl's ranks carry their own runtime_env, so Ray starts fresh processes for them anyway.
LOCAL_RAY_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
                 "RAY_prestart_worker_first_driver": "0"}


@dataclass(frozen=True)
class RaySession:
    """What `ray_session` started or joined."""

    address: str          # the GCS address ("host:port") or the ray:// address that was joined
    embedded: bool        # True when rlctl started Ray itself (and stops it on exit)
    owned: bool           # True when this context called ray.init (and so calls ray.shutdown)
    nodes: int
    cpus: float
    gpus: float
    session_dir: str      # Ray's logs live under <session_dir>/logs


def resolve_address(cli_address: str | None = None, config_address: str = "") -> str:
    """The Ray address to use: --address, then resources.address, then RAY_ADDRESS; "" = embedded."""
    for value in (cli_address, config_address, os.environ.get("RAY_ADDRESS", "")):
        if value and value.strip():
            return value.strip()
    return ""


def machine_cpus() -> int:
    """CPU cores this process may use (cgroup/affinity aware where the OS says so)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def _debug() -> bool:
    return os.environ.get("RLCTL_DEBUG", "") not in ("", "0")


def _init(address: str, num_cpus: int | None, log_to_driver: bool, namespace: str):
    import ray

    quiet = {"log_to_driver": log_to_driver, "logging_level": logging.DEBUG if _debug() else logging.WARNING,
             "namespace": namespace}
    if not address:
        for key, value in LOCAL_RAY_ENV.items():
            os.environ.setdefault(key, value)
        # address="local" starts a fresh instance even when RAY_ADDRESS is set in the shell.
        with _lean_head_node(log_to_driver), _keep_signal_handlers():
            return ray.init(address="local", num_cpus=num_cpus or machine_cpus(), include_dashboard=False,
                            **quiet)
    _check_reachable(address)
    try:
        with _keep_signal_handlers():
            return ray.init(address=address, **quiet)
    except (ConnectionError, TimeoutError, RuntimeError) as err:
        raise UsageError(f"could not join the Ray cluster at {address!r}: {str(err).splitlines()[0]}",
                         hint="start it with `ray start --head`, or fix --address / resources.address / "
                              "RAY_ADDRESS (empty = embedded Ray)") from None


@contextmanager
def _lean_head_node(log_to_driver: bool) -> Iterator[None]:
    """Start the embedded head node without three daemons a one-machine run never uses (~250 MB of
    the ~480 MB Ray's daemons take): the autoscaler monitor (there is no cluster to scale), the
    log monitor unless worker output goes to the terminal (workers still write Ray's log files),
    and the dashboard's API server (rlctl calls no job or state API). GCS, raylet and its agents
    run as usual.

    ray.init offers no switch for these, so for the duration of the call its Node class is a
    subclass that turns them off; Ray versions without that internal layout get the plain node.
    """
    try:
        from ray._private import node as ray_node
    except ImportError:
        yield
        return
    base = getattr(ray_node, "Node", None)
    if base is None or not hasattr(base, "start_api_server"):
        yield
        return

    class LeanHeadNode(base):
        def __init__(self, ray_params, *args, **kwargs):
            if kwargs.get("head") or (args and args[0] is True):
                ray_params.no_monitor = True
                if not log_to_driver:
                    ray_params.include_log_monitor = False
            super().__init__(ray_params, *args, **kwargs)

        def start_api_server(self, *args, **kwargs):
            return None

    ray_node.Node = LeanHeadNode
    try:
        yield
    finally:
        ray_node.Node = base


@contextmanager
def _keep_signal_handlers() -> Iterator[None]:
    """ray.init installs its own SIGTERM handler (sys.exit from inside whatever runs, a native stack
    dump); rlctl's handlers (rlctl.utils.interrupts) stay in place instead. Ray versions without
    that internal function keep theirs until ray_session puts ours back after ray.init."""
    try:
        from ray._private import utils as ray_utils
    except ImportError:
        yield
        return
    original = getattr(ray_utils, "set_sigterm_handler", None)
    if original is None:
        yield
        return
    ray_utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = original


def _check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail in seconds on a host:port nobody listens on (ray.init would retry for minutes)."""
    import socket

    hostport = address[len("ray://"):] if address.startswith("ray://") else address
    host, _, port = hostport.rpartition(":")
    if address == "auto" or not host or not port.isdigit():
        return  # "auto" finds the local cluster itself and fails fast when there is none
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise UsageError(f"could not join the Ray cluster at {address!r}: nothing answers at {host}:{port} ({err})",
                         hint="start it with `ray start --head`, or fix --address / resources.address / "
                              "RAY_ADDRESS (empty = embedded Ray)") from None


def _descendants() -> set[int]:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def _stop_partial_start(before: set[int], since: float) -> None:
    """After an embedded ray.init stopped half-way (an error, Ctrl-C): ray.shutdown() knows nothing
    yet, so end what it had started. Processes that were our children before (the reward pool)
    are spared."""
    import atexit

    import ray

    # ray.shutdown() may block on a half-started session (its GCS client waits on a dead GCS; a
    # signalled `rlctl train` was found blocked that way inside ray.init). Give it a few seconds,
    # then end the processes regardless, and keep Ray's atexit shutdown from blocking the exit.
    done = threading.Thread(target=ray.shutdown, daemon=True, name="rlctl-ray-shutdown")
    done.start()
    done.join(timeout=10.0)
    if done.is_alive():
        atexit.unregister(ray.shutdown)
    end_ray_processes(since=since, spare=before)


def end_ray_processes(*, since: float | None = None, spare: set[int] = frozenset(), grace_s: float = 3.0) -> None:
    """End this machine's Ray processes of this command: Ray's processes among our descendants and
    in our process group created since `since` (default: since this process started; the raylet's
    agents may have been reparented already: a killed raylet does not take them along), except the
    pids in `spare`. What a forced exit and a half-started ray.init leave to clean up."""
    import psutil

    me = psutil.Process()
    since = me.create_time() if since is None else since
    group = os.getpgid(0)
    for _ in range(2):   # a second pass for what a dying raylet spawned meanwhile
        procs, ours = [], {p.pid for p in me.children(recursive=True)}
        for proc in psutil.process_iter(["pid", "cmdline"]):
            try:
                cmd = " ".join(proc.info["cmdline"] or [])
                if proc.pid in spare or proc.pid == me.pid:
                    continue
                if proc.pid not in ours and (os.getpgid(proc.pid) != group or proc.create_time() < since):
                    continue
                if "ray::" in cmd or f"{os.sep}ray{os.sep}" in cmd:
                    proc.terminate()
                    procs.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, ProcessLookupError, PermissionError):
                pass
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for proc in alive:
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass


@contextmanager
def ray_session(address: str = "", *, num_cpus: int | None = None, log_to_driver: bool | None = None,
                namespace: str = "rlctl") -> Iterator[RaySession]:
    """Start embedded Ray (address "") or join a cluster ("auto", "host:port", "ray://host:port").

    When Ray is already initialised in this process (a test fixture, a notebook) it is used as is
    and left running. Worker groups created inside are always killed on exit, or parked for the next
    run in that Ray with RLCTL_WARM_RANKS=1 (rlctl.runtime.warm_ranks).
    """
    import ray

    from rlctl.runtime import warm_ranks, worker_group

    owned = not ray.is_initialized()
    if owned:
        # ray.init installs its own SIGTERM handling (a native stack dump and exit 1); keep ours.
        before, since = _descendants(), time.time() - 1.0   # create_time has a coarse clock
        main = threading.current_thread() is threading.main_thread()   # only it may set handlers
        handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)} if main else {}
        try:
            ctx = _init(address, num_cpus, _debug() if log_to_driver is None else log_to_driver, namespace)
        except BaseException as e:   # a failure or a signal in the middle of ray.init
            if address:
                ray.shutdown()   # joining a cluster starts nothing here to clean up
            else:
                _stop_partial_start(before, since)
            if isinstance(e, SystemExit) and e.code == signal.SIGTERM:   # ray.init's handler: sys.exit(15)
                raise Interrupted("stopped by SIGTERM while starting Ray", exit_code=EXIT_TERMINATED) from None
            raise
        finally:
            for s, h in handlers.items():
                if h is not None:
                    signal.signal(s, h)
        gcs = ctx.address_info.get("gcs_address") or ctx.address_info.get("address") or address
        session_dir = ctx.address_info.get("session_dir", "")
    else:
        gcs, session_dir = address, ""
    try:
        safe_point()   # a stop signal that came while Ray started (rlctl.utils.interrupts)
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        total = ray.cluster_resources()
        yield RaySession(address=gcs or address, embedded=owned and not address, owned=owned,
                         nodes=len(nodes), cpus=total.get("CPU", 0.0), gpus=total.get("GPU", 0.0),
                         session_dir=session_dir)
    finally:
        worker_group.shutdown_all(park=not owned)   # nothing outlives a Ray this session ends
        if owned:
            warm_ranks.forget()
            ray.shutdown()
