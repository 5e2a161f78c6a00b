"""Small real worker roles for the runtime tests (shipped to Ray workers by value)."""

from __future__ import annotations

import os
import threading
import time

import numpy as np

from rlctl.errors import CheckpointError
from rlctl.runtime import Batch, Dispatch, register


class HoldsALock(Exception):
    """An exception pickle cannot carry (as pydantic's ValidationError, which keeps its input)."""

    def __init__(self, message: str):
        super().__init__(message)
        self.lock = threading.Lock()


class EchoWorker:
    """Reports where it runs and what it got, and meets its peers in real gloo collectives."""

    def __init__(self, tag: str = "echo"):
        import torch.distributed as dist

        self.tag, self.rank, self.world = tag, dist.get_rank(), dist.get_world_size()

    @register(Dispatch.ALL)
    def whoami(self) -> dict:
        import ray
        import torch

        return {"tag": self.tag, "rank": self.rank, "world": self.world, "pid": os.getpid(),
                "threads": torch.get_num_threads(), "node_id": ray.get_runtime_context().get_node_id(),
                "omp": os.environ.get("OMP_NUM_THREADS")}

    @register(Dispatch.ALL)
    def progress_bars(self) -> dict:
        """Whether huggingface_hub and transformers would draw their tqdm bars in this worker."""
        from huggingface_hub.utils import are_progress_bars_disabled
        from transformers.utils.logging import is_progress_bar_enabled

        return {"env": os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS"), "hub": not are_progress_bars_disabled(),
                "transformers": is_progress_bar_enabled()}

    @register(Dispatch.DP)
    def tag_rows(self, batch: Batch, *, scale: float = 1.0) -> Batch:
        return Batch({"x": batch["x"] * scale, "rank": np.full(len(batch), self.rank)}, batch.meta)

    @register(Dispatch.DP)
    def count_rows(self, batch: Batch) -> int:
        return len(batch)

    @register(Dispatch.DP_TRAIN)
    def global_sum(self, batch: Batch) -> dict:
        """All-reduce of the shard sums: every rank returns the same total."""
        import torch
        import torch.distributed as dist

        total = torch.tensor([float(batch["x"].sum())], dtype=torch.float64)
        dist.all_reduce(total)
        return {"sum": float(total.item()), "rows": [int(v) for v in batch["x"].ravel()]}

    @register(Dispatch.RANK0)
    def rank_sum(self) -> float:
        import torch
        import torch.distributed as dist

        t = torch.tensor([float(self.rank + 1)])
        dist.all_reduce(t)
        return float(t.item())

    @register(Dispatch.ALL)
    def stall(self, victim: int, seconds: float = 60.0) -> int:
        """The victim sleeps; the others wait for it in a barrier (a hang without failure handling)."""
        import torch.distributed as dist

        if self.rank == victim:
            time.sleep(seconds)
        dist.barrier()
        return self.rank

    @register(Dispatch.ALL)
    def peer_dies(self, victim: int, after_s: float) -> int:
        """The victim's process exits after `after_s`; the others raise at once, as a collective does when
        it notices the closed connection before Ray has noticed the death."""
        if self.rank == victim:
            time.sleep(after_s)
            os._exit(1)
        raise RuntimeError("Connection closed by peer")

    @register(Dispatch.ALL)
    def fail_on(self, rank: int, known: bool = False) -> int:
        if self.rank == rank:
            if known:
                raise CheckpointError("checkpoint step_3 is missing optimizer shards")
            raise ValueError("boom from inside the worker")
        return self.rank

    @register(Dispatch.ALL)
    def fail_unpicklable(self) -> None:
        raise HoldsALock("the model's config is invalid: max_model_len 4096 > 512")

    def not_remote(self) -> None:
        """No @register: the controller cannot call it."""


class OtherWorker:
    """A second role, to check co-location (same process) and separate groups."""

    def __init__(self, offset: int = 0):
        self.offset = offset

    @register(Dispatch.ALL)
    def pid(self) -> int:
        return os.getpid() + 0 * self.offset
