"""`WorkerHost`: the Ray actor behind one rank of a worker group.

The host sets the torch thread count, joins the group's torch.distributed process group (gloo on
CPU, NCCL for CUDA tensors) and then holds one object per role (`actor`, `critic`, ...).
Co-located roles are objects in the same process: they share the rank, the device and the
process group, and the actor/rollout/reference roles share one copy of the weights.
"""

from __future__ import annotations

import contextlib
import os
import time
from datetime import timedelta
from typing import Any, Iterator

from rlctl.utils.net import free_port


class WorkerHost:
    """One rank. Created by WorkerGroup through `ray.remote(WorkerHost).options(...)`."""

    def __init__(self, rank: int, world_size: int, local_rank: int, cpus: int, use_gpu: bool):
        import torch

        self.rank, self.world_size, self.local_rank, self.use_gpu = rank, world_size, local_rank, use_gpu
        self.roles: dict[str, Any] = {}
        # Each worker owns `cpus` cores: more threads than cores only makes ranks fight.
        self.threads = max(1, cpus)
        torch.set_num_threads(self.threads)
        self.env = dict(os.environ)   # what reset() restores (roles may set variables)
        self.limits = _resource_limits()   # and these (lowered by a fault drill or an in-process limit)
        if use_gpu:
            torch.cuda.set_device(0)  # Ray narrows CUDA_VISIBLE_DEVICES to this actor's GPU

    def node_info(self) -> dict:
        import ray

        ctx = ray.get_runtime_context()
        return {"rank": self.rank, "pid": os.getpid(), "node_id": ctx.get_node_id(),
                "ip": ray.util.get_node_ip_address(), "port": free_port() if self.rank == 0 else 0}

    def init_process_group(self, master_addr: str, master_port: int, timeout_s: float,
                           spans_nodes: bool = False) -> None:
        import torch.distributed as dist

        if spans_nodes:
            _gloo_on_node_address()
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(self.rank),
                          WORLD_SIZE=str(self.world_size), LOCAL_RANK=str(self.local_rank))
        backend = "cpu:gloo,cuda:nccl" if self.use_gpu else "gloo"
        dist.init_process_group(backend=backend, rank=self.rank, world_size=self.world_size,
                                timeout=timedelta(seconds=timeout_s))

    def add_role(self, name: str, cls: type, kwargs: dict) -> None:
        with _carried_by_ray():
            self.roles[name] = cls(**kwargs)

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> tuple[Any, float]:
        """(result, seconds spent in the method): the controller's overhead is the rest."""
        start = time.perf_counter()
        with _carried_by_ray():
            result = getattr(self.roles[role], method)(*args, **kwargs)
        return result, time.perf_counter() - start

    def reset(self) -> bool:
        """Back to the state of a new rank for the next group of the same shape (runtime/warm_ranks.py):
        no roles, no process group, the start-up environment and thread count. False when this process
        ran code whose state outlives the run and must end instead."""
        import gc

        import torch

        self.shutdown()
        gc.collect()
        os.environ.clear()
        os.environ.update(self.env)
        torch.set_num_threads(self.threads)
        return _restore_resource_limits(self.limits) and not unforgettable_modules()

    def shutdown(self) -> None:
        """Leave the process group cleanly (best effort: the group may already be broken)."""
        import torch.distributed as dist

        self.roles.clear()
        if dist.is_initialized():
            dist.destroy_process_group()


def _resource_limits() -> dict[int, tuple[int, int]]:
    """This process's resource limits (file size, open files, memory, ...), by resource."""
    import resource

    return {getattr(resource, name): resource.getrlimit(getattr(resource, name))
            for name in dir(resource) if name.startswith("RLIMIT_")}


def _restore_resource_limits(limits: dict[int, tuple[int, int]]) -> bool:
    """Put back the limits the process started with; False when one cannot be raised again (a lowered
    hard limit without the privilege): such a rank would fail the next run's writes, so it ends."""
    import resource

    for which, start in limits.items():
        try:
            if resource.getrlimit(which) != start:
                resource.setrlimit(which, start)
        except (ValueError, OSError):
            return False
    return True


# Packages whose import leaves process-wide state behind (engine processes, distributed state, patches).
_ENGINES = ("vllm", "sglang")


def unforgettable_modules() -> list[str]:
    """Modules this process imported that a later run must not inherit: code from outside the installed
    packages (a project's reward function, a plugin, a test's roles: cached in sys.modules and in
    registries) and inference engines."""
    import sys

    import rlctl

    installed = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    installed.add(os.path.realpath(os.path.dirname(rlctl.__file__)))
    found = []
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] in _ENGINES:
            found.append(name)
            continue
        path = getattr(module, "__file__", None)   # torch.ops and the like name no real file
        if not (isinstance(path, str) and os.path.isabs(path)):
            continue
        if not any(os.path.realpath(path).startswith(root + os.sep) for root in installed):
            found.append(name)
    return found


@contextlib.contextmanager
def _carried_by_ray() -> Iterator[None]:
    """An exception that cannot be pickled leaves as UnpicklableWorkerError (its name and message), so the
    controller's one line says what went wrong (rlctl.runtime.failures)."""
    from rlctl.runtime.failures import portable

    try:
        yield
    except Exception as err:
        carried = portable(err)
        if carried is err:
            raise
        raise carried from err


def kill_hosts(actors: list) -> None:
    """End these WorkerHost actors' processes now (no restart); already dead ones or a gone Ray are fine."""
    import ray

    for actor in actors:
        try:
            ray.kill(actor, no_restart=True)
        except Exception:  # already dead, or Ray is gone
            pass


def _gloo_on_node_address() -> None:
    """Make gloo listen on the interface Ray knows this node by. Left alone, gloo binds to the address
    the machine's hostname resolves to, which /etc/hosts often maps to 127.0.0.1 (127.0.1.1 on Debian):
    each rank then tells the others to connect to its loopback, and a group spread over two nodes fails
    with `Gloo connectFullMesh failed ... remote=[127.0.0.1]`. GLOO_SOCKET_IFNAME set by the user wins."""
    import ray

    from rlctl.utils.net import interface_of

    if os.environ.get("GLOO_SOCKET_IFNAME"):
        return
    iface = interface_of(ray.util.get_node_ip_address())
    if iface is not None:
        os.environ["GLOO_SOCKET_IFNAME"] = iface
