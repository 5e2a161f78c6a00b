"""Expert parallelism, ep 1 vs 2: per-rank trained-parameter bytes and update step time.

    python bench/expert_parallel_bench.py [--hidden 128] [--layers 2] [--rows 8] [--width 64] [--steps 5]

Two gloo ranks (spawned processes, one thread each) train a tiny Qwen3-MoE (`rlctl model tiny
--arch qwen3_moe` layout: 4 experts, top-2) with rlctl's TrainEngine: FSDP2 over both ranks, and
with actor.expert_parallel_size = 2 the experts split instead. Printed per ep: the bytes of
trained parameters each rank holds (AdamW keeps two more copies of the same size), the bytes of
one MoE layer's expert banks that an update's forward materialises whole on a rank (FSDP gathers
every expert; ep keeps E/ep), and the median seconds of an optimizer step (forward, backward,
AdamW) on `--rows` rows of `--width` tokens per rank.
"""

from __future__ import annotations

import argparse
import datetime
import os
import statistics
import tempfile
import time

import torch
import torch.multiprocessing as mp

WORLD = 2


def _rank(rank, model_dir, init_file, out_file, ep, args):
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from rlctl.workers.compute.engine import OptimSpec, TrainEngine
    from rlctl.workers.parallel.expert_parallel import expert_modules

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=300))
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engine = TrainEngine(model, OptimSpec(lr=1e-4, weight_decay=0.0, grad_clip=1.0, warmup_steps=0, total_steps=1),
                         compute_dtype=torch.float32, expert_parallel_size=ep)
    local = sum((p._local_tensor if hasattr(p, "_local_tensor") else p).numel() * 4 for p in engine.params)
    experts = expert_modules(engine.module)[0][1]
    layer_bank = (experts.num_experts if ep > 1 else model.config.num_experts) * \
        (experts.gate_up_proj.shape[1] * experts.gate_up_proj.shape[2] + experts.down_proj.shape[1] *
         experts.down_proj.shape[2]) * 4
    ids = torch.randint(3, 200, (args.rows, args.width), generator=torch.Generator().manual_seed(rank))

    def loss_fn(micro):
        logits = engine.module(input_ids=micro["ids"], use_cache=False).logits
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                 micro["ids"][:, 1:].reshape(-1)), {}

    times = []
    for _ in range(args.steps + 1):
        dist.barrier()
        start = time.perf_counter()
        engine.train_mini_batch([{"ids": ids}], loss_fn)
        times.append(time.perf_counter() - start)
    if rank == 0:
        with open(out_file, "w") as f:
            f.write(f"{local} {layer_bank} {statistics.median(times[1:])}\n")
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rows", type=int, default=8)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    args = parser.parse_args()
    from rlctl.models.tiny import build_tiny_model

    with tempfile.TemporaryDirectory() as tmp:
        info = build_tiny_model(os.path.join(tmp, "moe"), arch="qwen3_moe", hidden=args.hidden, layers=args.layers)
        print(f"tiny qwen3_moe: {info.get('parameters', '?')} parameters, 4 experts top-2, hidden {args.hidden}, "
              f"{args.layers} layers; {WORLD} gloo ranks, {args.rows} x {args.width} tokens per rank")
        print("ep | trained params per rank (MB) | one layer's experts whole in an update (MB) | step (s, median)")
        for ep in (1, 2):
            out = os.path.join(tmp, f"ep{ep}.txt")
            mp.start_processes(_rank, args=(os.path.join(tmp, "moe"), os.path.join(tmp, f"pg{ep}"), out, ep, args),
                               nprocs=WORLD, join=True, start_method="spawn")
            local, bank, step = open(out).read().split()
            print(f"{ep} | {int(local) / 1e6:.2f} | {int(bank) / 1e6:.2f} | {float(step):.3f}")


if __name__ == "__main__":
    main()
