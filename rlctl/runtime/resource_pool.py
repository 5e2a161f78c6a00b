"""Resource pools: `[resources]` turned into a Ray placement group, one bundle per node.

    GPU (gpus_per_node > 0): nodes x gpus_per_node ranks, each 1 GPU + cpus_per_worker CPUs.
    CPU (gpus_per_node = 0): resources.workers ranks, workers / nodes per node, each
                             cpus_per_worker CPUs (and as many torch threads).

Bundle i holds everything node i's ranks need; with several nodes the bundles are STRICT_SPREAD
so that each lands on a different node, and rank r lives in bundle r // ranks_per_node, so
ranks 0..k-1 share node 0 (fast local collectives) and rank 0 is the master of the group.
"""

from __future__ import annotations

import time

from rlctl.errors import ConfigError, UsageError
from rlctl.utils.interrupts import safe_point


def visible_gpus() -> int:
    """The CUDA GPUs this process sees (CUDA_VISIBLE_DEVICES applies); 0 without CUDA."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def resolve_gpus_per_node(value: int | str, address: str = "") -> tuple[int, str]:
    """resources.gpus_per_node as a number, and why ("" when it was one): "auto" is every GPU this
    machine sees. The one place "auto" becomes a number (start-up, validate, a bare Config's pool).
    With a cluster `address` "auto" is a ConfigError: this machine's GPUs say nothing of its nodes."""
    if value != "auto":
        return int(value), ""
    if address:
        raise ConfigError("resources.gpus_per_node = \"auto\" counts this machine's GPUs, which says nothing "
                          f"about the nodes of the Ray cluster (address {address})",
                          hint="set resources.gpus_per_node to the GPUs each node gives this run (0 = CPU)")
    n = visible_gpus()
    return n, (f"auto: {n} CUDA GPU(s) visible" if n else "auto: no GPU visible, CPU")


GPU_WORKERS_HINT = "on GPUs every GPU is one worker; leave resources.workers at 1"


def gpu_workers_mismatch(workers: int, gpu_world: int) -> str:
    """Why resources.workers cannot be used on `gpu_world` GPUs ("" when it can: 1 or every GPU)."""
    if workers in (1, gpu_world):
        return ""
    return f"resources.workers = {workers} does not match nodes x gpus_per_node = {gpu_world}"


class ResourcePool:
    """A placement group for one worker group; `ready()` reserves it, `remove()` frees it."""

    def __init__(self, resources, *, name: str = "workers"):
        self.name = name
        self.nodes = resources.nodes
        self.cpus_per_worker = resources.cpus_per_worker
        # "auto" was resolved at start-up; a Config built in code (tests, scripts) may still hold it
        gpus, _ = resolve_gpus_per_node(resources.gpus_per_node, resources.address)
        self.use_gpu = gpus > 0
        if self.use_gpu:
            self.world_size = resources.nodes * gpus
            mismatch = gpu_workers_mismatch(resources.workers, self.world_size)
            if mismatch:
                raise ConfigError(mismatch, hint=GPU_WORKERS_HINT)
        else:
            self.world_size = resources.workers
            if resources.workers % resources.nodes:
                raise ConfigError(f"resources.workers = {resources.workers} does not spread evenly over "
                                  f"resources.nodes = {resources.nodes}",
                                  hint="make workers a multiple of nodes")
        self.ranks_per_node = self.world_size // self.nodes
        self.placement_group = None

    def bundles(self) -> list[dict[str, float]]:
        k = self.ranks_per_node
        bundle = {"CPU": float(k * self.cpus_per_worker)}
        if self.use_gpu:
            bundle["GPU"] = float(k)
        return [dict(bundle) for _ in range(self.nodes)]

    def bundle_of(self, rank: int) -> int:
        return rank // self.ranks_per_node

    def actor_options(self, rank: int) -> dict:
        """Ray actor options that pin `rank` to its bundle with its share of CPUs/GPUs."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        strategy = PlacementGroupSchedulingStrategy(self.placement_group,
                                                    placement_group_bundle_index=self.bundle_of(rank))
        return {"num_cpus": self.cpus_per_worker, "num_gpus": 1 if self.use_gpu else 0,
                "scheduling_strategy": strategy}

    def ready(self, timeout_s: float = 60.0, on_wait=None, wait_s: float = 5.0) -> None:
        """Reserve the placement group; a clear UsageError when the cluster cannot hold it. on_wait:
        called once if it is not ready within wait_s (WorkerGroup frees parked warm ranks then)."""
        import ray
        from ray.util.placement_group import placement_group

        if self.placement_group is not None:
            return
        strategy = "STRICT_SPREAD" if self.nodes > 1 else "PACK"
        self.placement_group = placement_group(self.bundles(), strategy=strategy, name="")
        start = time.monotonic()
        while not self._wait(0.5):
            safe_point()   # a stop signal while the workers wait for their resources
            if on_wait is not None and time.monotonic() - start > wait_s:
                on_wait()
                on_wait = None
            if time.monotonic() - start > timeout_s:
                self.remove()
                raise UsageError(self._shortfall(ray.cluster_resources(), len(ray.nodes())),
                                 hint="lower resources.workers / cpus_per_worker / gpus_per_node, or add nodes")

    def _wait(self, seconds: float) -> bool:
        import ray

        ready, _ = ray.wait([self.placement_group.ready()], timeout=seconds)
        return bool(ready)

    def _shortfall(self, total: dict, nodes: int) -> str:
        need = self.bundles()[0]
        what = ", ".join(f"{v:g} {k}" for k, v in need.items())
        have = ", ".join(f"{total.get(k, 0):g} {k}" for k in need)
        return (f"the {self.name} workers need {self.nodes} node(s) with {what} each, but Ray has "
                f"{nodes} node(s) with {have} in all (or they are taken by another group)")

    def remove(self) -> None:
        """Free the placement group (idempotent)."""
        if self.placement_group is not None:
            free_placement_group(self.placement_group)
        self.placement_group = None


def free_placement_group(placement_group, timeout_s: float = 5.0) -> None:
    """Remove a placement group. A Ray whose raylet was killed (SIGTERM to the whole process group,
    e.g. by `timeout` or a service manager) never answers, so wait at most `timeout_s`:
    ray.shutdown() frees everything anyway."""
    import threading

    def remove() -> None:
        try:
            from ray.util.placement_group import remove_placement_group

            remove_placement_group(placement_group)
        except Exception:  # Ray already gone: nothing left to free
            pass

    worker = threading.Thread(target=remove, daemon=True, name="rlctl-remove-placement-group")
    worker.start()
    worker.join(timeout_s)
