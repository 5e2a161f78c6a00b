"""A weight push from expert-parallel ranks into rlctl's vLLM engine on CPU, in processes of their own,
printing what each rank saw as JSON.

Usage: python vllm_moe_check.py MODEL_A MODEL_B (two tiny Qwen3-MoE folders, same shapes, head size
32). Two gloo ranks, as a worker group runs them: each trains model A with its experts split over
both (rlctl's TrainEngine, actor.expert_parallel_size = 2) and builds a vLLM engine on model B that
joins the ranks' torch.distributed world (external_launcher, one engine per rank). Model A is
pushed from the split ranks (engine_weights outside whole_weights: each bank gathered on the way);
each rank then generates greedily from its own fixed prompts and reports vLLM's log-probs of those
tokens beside the trainer's (the log-prob pass, experts gathered). Last, a push of the rank's own
share of one bank, which the engine must refuse.
"""

from __future__ import annotations

import datetime
import json
import os
import sys
import tempfile

import torch
import torch.multiprocessing as mp

WORLD = 2
PROMPTS = {0: [[5, 6, 7, 8], [50, 60, 70]], 1: [[100, 3, 200, 9, 11], [21, 22]]}


def _trainer_log_probs(trainer, prompts: list, out: dict) -> list:
    from rlctl.workers.compute.logprob import response_log_probs

    rows = []
    with trainer.inference() as module:
        for prompt, resp, length in zip(prompts, out["responses"].tolist(), out["response_length"].tolist()):
            ids = torch.tensor([prompt + resp[:length]])
            rows.append(response_log_probs(module, ids, torch.ones_like(ids), length)["log_prob"][0].tolist())
    return rows


def _rank_main(rank: int, model_a: str, model_b: str, port: int, out_dir: str) -> None:
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    from rlctl.errors import WorkerDiedError
    from rlctl.workers.compute.engine import OptimSpec, TrainEngine
    from rlctl.workers.parallel.expert_parallel import split_modules
    from rlctl.workers.rollout.gpu import GPUEngineSpec
    from rlctl.workers.rollout.vllm import VLLMRolloutEngine
    from rlctl.workers.rollout.weights import engine_weights

    torch.set_num_threads(1)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD, timeout=datetime.timedelta(seconds=600))
    spec = OptimSpec(lr=1e-3, weight_decay=0.0, grad_clip=1.0, warmup_steps=0, total_steps=1)
    trainer = TrainEngine(AutoModelForCausalLM.from_pretrained(model_a, dtype=torch.float32), spec,
                          compute_dtype=torch.float32, expert_parallel_size=WORLD)
    engine = VLLMRolloutEngine(GPUEngineSpec(model_path=model_b, dtype="float32", max_model_len=64, seed=3,
                                             enforce_eager=True), pad_token_id=0, eos_token_ids=[1])
    prompts = PROMPTS[rank]
    report: dict = {"experts_here": int(split_modules(trainer.module)[0][1].gate_up_proj.shape[0])}
    report["before_push"] = engine.generate(prompts, n=1, max_new_tokens=10, greedy=True)["rollout_log_prob"].tolist()
    engine.update_weights(engine_weights(trainer.module, dtype=torch.float32))
    out = engine.generate(prompts, n=1, max_new_tokens=10, greedy=True)
    report["vllm"] = [row[:n] for row, n in zip(out["rollout_log_prob"].tolist(), out["response_length"].tolist())]
    report["trainer"] = _trainer_log_probs(trainer, prompts, out)
    name, module = split_modules(trainer.module)[0]
    partial = [(f"{name}.gate_up_proj", module.gate_up_proj.detach().clone())]   # this rank's share only
    try:
        engine.update_weights(partial)
        report["partial_push"] = "no error"
    except WorkerDiedError as e:
        report["partial_push"] = e.message
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    engine.close()   # the process ends here: vLLM has taken over the default process group


def main(model_a: str, model_b: str) -> dict:
    from rlctl.utils.net import free_port

    with tempfile.TemporaryDirectory() as out_dir:
        mp.start_processes(_rank_main, args=(model_a, model_b, free_port(), out_dir), nprocs=WORLD, join=True,
                           start_method="spawn")
        ranks = []
        for rank in range(WORLD):
            with open(os.path.join(out_dir, f"rank{rank}.json")) as f:
                ranks.append(json.load(f))
    return {"ranks": ranks}


if __name__ == "__main__":
    print("REPORT " + json.dumps(main(sys.argv[1], sys.argv[2])))
