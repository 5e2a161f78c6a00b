"""Worker groups: N Ray actors (ranks) forming one torch.distributed process group.

    pool = ResourcePool(cfg.resources, name="actor")
    group = WorkerGroup(pool, {"actor": (ActorRolloutRefWorker, {"config": cfg, ...}),
                               "critic": (CriticWorker, {"config": cfg, ...})}, name="actor")
    actor = group.role("actor")
    out = actor.compute_log_prob(batch)        # split by @register(Dispatch.DP), joined in order

Several roles in one group are co-located: every rank holds one object per role. A call is sent
to every rank before any result is awaited, and the first failing rank stops the call with
WorkerDiedError (exit 4) naming the role and rank; the group is then killed, never left hanging.
"""

from __future__ import annotations

import functools
import os
import time
import weakref
from typing import Any

from rlctl.errors import WorkerDiedError
from rlctl.runtime import warm_ranks
from rlctl.runtime.balance import balance_rows, restore_order
from rlctl.runtime.batch import Batch
from rlctl.runtime.dispatch import Dispatch, collect_results, dispatch_mode, split_arguments
from rlctl.runtime.failures import wait_all
from rlctl.utils.output import QUIET_ENV

# Every live group, so `ray_session` can kill them on any way out.
_LIVE: "weakref.WeakSet[WorkerGroup]" = weakref.WeakSet()

# Environment each worker process starts with: one thread per core it owns, no hub downloads
# unless the driver allows them, and the debug switch.
_FORWARDED_ENV = ("RLCTL_DEBUG", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME", "HF_TOKEN",
                  "HF_HUB_DISABLE_PROGRESS_BARS", "TOKENIZERS_PARALLELISM")


def rank_env(threads: int) -> dict[str, str]:
    """The environment a worker process starts with, using `threads` cores (runtime_env env_vars)."""
    env = {k: os.environ[k] for k in _FORWARDED_ENV if k in os.environ}
    env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), TOKENIZERS_PARALLELISM="false",
               **QUIET_ENV)
    return env


def shutdown_all(*, park: bool = True) -> None:
    for group in list(_LIVE):
        group.shutdown(park=park)


class WorkerGroup:
    """The ranks of one pool, each hosting one object per role (co-located roles)."""

    def __init__(self, pool, roles: dict[str, tuple[type, dict]], *, name: str = "workers",
                 collective_timeout_s: float = 1800.0):
        import ray

        from rlctl.runtime.host import WorkerHost

        self.name, self.pool, self.role_classes = name, pool, {r: cls for r, (cls, _) in roles.items()}
        self.world_size = pool.world_size
        self._broken: str | None = None
        # Seconds per "role.method": wall (controller) and worker (slowest rank inside the method).
        # wall - worker is the controller's overhead: splitting, serialisation, object store.
        self.timing: dict[str, dict[str, float]] = {}
        self._logs = _session_logs()
        self._unfinished_calls = 0   # submitted, result not collected: such a group is never parked
        env = rank_env(pool.cpus_per_worker)
        self._env = env
        self._actors = warm_ranks.take(pool, env)
        if self._actors is None:
            pool.ready(on_wait=warm_ranks.drop)   # parked ranks may hold what this group waits for
            host = ray.remote(WorkerHost)
            self._actors = [
                host.options(**pool.actor_options(rank), runtime_env={"env_vars": env}).remote(
                    rank, self.world_size, rank % pool.ranks_per_node, pool.cpus_per_worker, pool.use_gpu)
                for rank in range(self.world_size)
            ]
        _LIVE.add(self)
        try:
            self.info = self._all("node_info", role=name)
            master = self.info[0]
            spans_nodes = len({i["node_id"] for i in self.info}) > 1
            self._all("init_process_group", master["ip"], master["port"], collective_timeout_s, spans_nodes,
                      role=name)
            for role, (cls, kwargs) in roles.items():
                self._all("add_role", role, cls, kwargs, role=role, method=f"{cls.__name__}.__init__")
        except BaseException as err:
            self._broken = self._broken or f"start-up failed ({type(err).__name__})"
            self.shutdown()
            raise

    # --- calls -----------------------------------------------------------------------------
    def role(self, name: str) -> "RoleHandle":
        if name not in self.role_classes:
            raise KeyError(f"group {self.name!r} has no role {name!r}; it has {sorted(self.role_classes)}")
        return RoleHandle(self, name, self.role_classes[name])

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run `role`.`method` on every rank with its registered dispatch; see RoleHandle."""
        return self.submit(role, method, *args, **kwargs).result()

    def submit(self, role: str, method: str, *args: Any, **kwargs: Any) -> "PendingCall":
        """As `call`, but returns as soon as every rank has the call: `.result()` waits and joins.
        The controller runs other groups meanwhile (one-step off-policy generation). A rank runs
        its calls in the order they were submitted."""
        mode = dispatch_mode(self.role_classes[role], method)
        label = f"{role}.{method}"
        args, kwargs, inverse = balance_rows(mode, self.world_size, args, kwargs)   # balanced(batch): by tokens
        per_rank = split_arguments(mode, self.world_size, _put_shared(mode, args), _put_shared(mode, kwargs),
                                   label)
        start = time.perf_counter()
        refs = [actor.call.remote(role, method, *a, **k) for actor, (a, k) in zip(self._actors, per_rank)]
        self._unfinished_calls += 1
        return PendingCall(self, role, method, mode, refs, start, inverse)

    def _finish(self, call: "PendingCall") -> Any:
        results = self._wait(call.refs, role=call.role, method=call.method)
        self._unfinished_calls -= 1
        joined = restore_order(collect_results(call.mode, [r for r, _ in results]), call.inverse)
        entry = self.timing.setdefault(f"{call.role}.{call.method}", {"calls": 0, "wall_s": 0.0, "worker_s": 0.0})
        entry["calls"] += 1
        entry["wall_s"] += time.perf_counter() - call.start
        entry["worker_s"] += max(seconds for _, seconds in results)
        return joined

    def _all(self, host_method: str, *args: Any, role: str, method: str | None = None) -> list:
        refs = [getattr(actor, host_method).remote(*args) for actor in self._actors]
        return self._wait(refs, role=role, method=method or host_method)

    def _wait(self, refs: list, *, role: str, method: str) -> list:
        if self._broken:
            raise WorkerDiedError(f"the {self.name} worker group is down after an earlier failure: {self._broken}")
        try:
            return wait_all(refs, role=role, method=method, logs=self._logs)
        except BaseException as err:
            # A failed rank leaves its peers stuck in collectives: kill the whole group now.
            self._broken = getattr(err, "message", None) or type(err).__name__
            self.shutdown()
            raise

    # --- introspection and teardown -----------------------------------------------------------
    def pids(self) -> list[int]:
        return [i["pid"] for i in self.info]

    def node_ids(self) -> list[str]:
        return [i["node_id"] for i in self.info]

    def shutdown(self, *, park: bool = True) -> None:
        """Kill every rank and free the placement group (idempotent). With warm ranks on, a healthy
        group with no call in flight is parked for the next group of its shape instead (`park`)."""
        from rlctl.runtime.host import kill_hosts

        actors, self._actors = getattr(self, "_actors", None) or [], []
        _LIVE.discard(self)
        if (park and actors and warm_ranks.enabled() and not self._broken and not self._unfinished_calls
                and warm_ranks.park(self.pool, self._env, actors)):
            return
        kill_hosts(actors)
        self.pool.remove()

    def __enter__(self) -> "WorkerGroup":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


class PendingCall:
    """A call every rank has received; `result()` waits for all of them (once) and joins the results."""

    def __init__(self, group: WorkerGroup, role: str, method: str, mode, refs: list, start: float, inverse=None):
        self.group, self.role, self.method, self.mode, self.refs, self.start = group, role, method, mode, refs, start
        self.inverse = inverse   # rlctl.runtime.balance: the row order the joined result goes back to
        self._done, self._value = False, None

    def result(self) -> Any:
        if not self._done:
            self._value, self._done = self.group._finish(self), True
        return self._value


class RoleHandle:
    """`handle.method(*args)` runs the role's method on all ranks with its registered dispatch."""

    def __init__(self, group: WorkerGroup, role: str, cls: type):
        self.group, self.role, self.cls = group, role, cls

    def __getattr__(self, method: str):
        if method.startswith("__"):
            raise AttributeError(method)
        dispatch_mode(self.cls, method)  # AttributeError now, not at call time
        return functools.partial(self.group.call, self.role, method)

    def submit(self, method: str, *args: Any, **kwargs: Any) -> PendingCall:
        """Start `method` on every rank without waiting (WorkerGroup.submit)."""
        return self.group.submit(self.role, method, *args, **kwargs)

    @property
    def world_size(self) -> int:
        return self.group.world_size

    def __repr__(self) -> str:
        return f"RoleHandle({self.role!r}, {self.cls.__name__}, ranks={self.group.world_size})"


def _put_shared(mode: Dispatch, values):
    """ALL/RANK0 send the same Batch or dict (a weight push) to every rank: put it in the object
    store once."""
    if mode not in (Dispatch.ALL, Dispatch.RANK0):
        return values
    import ray

    def shared(v):
        return ray.put(v) if isinstance(v, (Batch, dict)) else v

    if isinstance(values, dict):
        return {k: shared(v) for k, v in values.items()}
    return tuple(shared(v) for v in values)


def _session_logs() -> str:
    try:
        from ray._private.worker import global_worker  # session dir for error hints only

        return os.path.join(global_worker.node.get_session_dir_path(), "logs")
    except Exception:
        return ""
