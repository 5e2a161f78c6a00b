"""A toy trained role, added to a run by one row of the role table (rlctl.workers.roles.table), to show
that a new trained role is its worker class plus that row: start-up places it, every checkpoint
saves it into <step>/toy/ and resume loads it back, with no other change to rlctl.

Its weights are the run's model plus noise drawn afresh each time the role starts (the same on
every rank), so a resumed run holds the checkpoint's weights only if resume loaded them.
"""

from __future__ import annotations

import os

from rlctl.workers.compute.engine import trained_role_methods
from rlctl.workers.roles.table import BESIDE_ACTOR, Role


class ToyWorker:
    def __init__(self, config, *, total_steps: int = 0):
        import torch
        import torch.distributed as dist

        from rlctl.workers.compute.engine import OptimSpec, TrainEngine
        from rlctl.workers.compute.models import load_causal_lm

        model = load_causal_lm(config.model)
        seed = [int.from_bytes(os.urandom(4), "little")]
        if dist.is_initialized():
            dist.broadcast_object_list(seed, src=0)
        noise = torch.Generator().manual_seed(seed[0])   # its own generator: the actor's RNG is left alone
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn(param.shape, generator=noise) * 0.01)
        self.engine = TrainEngine(model, OptimSpec(lr=1e-3, weight_decay=0.0, grad_clip=1.0, warmup_steps=0,
                                                   total_steps=total_steps), compute_dtype=torch.float32)

    flops_profile, save_checkpoint, load_checkpoint = trained_role_methods("engine")


TOY = Role("toy", f"{__name__}:ToyWorker", BESIDE_ACTOR, trained=True,
           instances=lambda run: {"toy": {"config": run.config, "total_steps": run.total_steps}})
