"""Per-rank activation memory and step time of one long-response micro-batch, sp = 1 against sp = 2.

    python bench/ulysses_bench.py [--rows 4] [--response 1024] [--hidden 256] [--layers 4]

A Llama-style model from a config (no download), a micro-batch of `rows` sequences of a 16-token
prompt and a `response`-token response, the actor's loss path (rlctl.workers.compute.logprob.response_log_probs
with entropy). "activations" = bytes of the tensors autograd saves for backward (parameters excluded,
each storage counted once) on one rank: the memory sequence parallelism divides. sp = 1 runs the
layout rlctl uses without sp on SDPA (trim); sp = 2 runs two gloo ranks (rlctl.workers.parallel.ulysses).
Prints one JSON line per sp size.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def _model(args):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=2048, hidden_size=args.hidden, intermediate_size=args.hidden * 3,
                         num_hidden_layers=args.layers, num_attention_heads=8, num_key_value_heads=2,
                         max_position_embeddings=args.response + 64, attn_implementation="sdpa")
    return LlamaForCausalLM(config)


def _micro(args):
    g = torch.Generator().manual_seed(0)
    prompt, width = 16, 16 + args.response
    ids = torch.randint(0, 2048, (args.rows, width), generator=g)
    mask = torch.ones_like(ids)
    for r in range(args.rows):   # responses of different lengths, right-padded
        mask[r, width - r * 7:] = 0
    return ids, mask, mask[:, prompt:].float()


def _measure(model, args, sp=None) -> dict:
    from rlctl.workers.compute.logprob import response_log_probs

    ids, mask, response_mask = _micro(args)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    times, saved = [], {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in params:
            saved[ptr] = t.untyped_storage().nbytes()
        return t

    for _ in range(3):
        saved.clear()
        model.zero_grad(set_to_none=True)
        start = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = response_log_probs(model, ids, mask, response_mask.shape[1], with_entropy=True, pack=False,
                                     sp=sp)
        loss = -(out["log_prob"] * response_mask).sum() / response_mask.sum()
        loss.backward()
        times.append(time.perf_counter() - start)
    return {"activations_mib": round(sum(saved.values()) / 2**20, 1), "step_s": round(statistics.median(times), 3),
            "tokens": int(mask.sum())}


def _rank(rank, args, init_file, out):
    import torch.distributed as dist

    from rlctl.workers.parallel import ulysses

    torch.set_num_threads(args.threads)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=600))
    sp = ulysses.new_groups(2)
    result = _measure(_model(args), args, sp)
    out[rank] = result
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--response", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    base = {"rows": args.rows, "response": args.response, "hidden": args.hidden, "layers": args.layers,
            "torch": torch.__version__, "transformers": __import__("transformers").__version__}
    print(json.dumps({"sp": 1, **base, **_measure(_model(args), args)}), flush=True)
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(_rank, args=(args, os.path.join(tmp, "pg"), out), nprocs=2, join=True,
                           start_method="spawn")
        ranks = [out[r] for r in range(2)]
    print(json.dumps({"sp": 2, **base, "activations_mib_per_rank": [r["activations_mib"] for r in ranks],
                      "step_s": max(r["step_s"] for r in ranks), "tokens": ranks[0]["tokens"]}), flush=True)


if __name__ == "__main__":
    main()
