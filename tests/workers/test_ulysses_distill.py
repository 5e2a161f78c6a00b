"""On-policy distillation under Ulysses sequence parallelism on two real gloo ranks against one rank.

The teacher pass (rlctl.workers.roles.teacher.teacher_outputs) at sp = 2 gives the teacher's log-prob of
each sampled token, its top-k ids and log-probs, and whether the sampled token is among them, as
one rank does; the student's top-k log-probs at the teacher's ids (response_log_probs gather_ids,
read by the forward_kl_topk and jsd losses) and their gradients equal one rank's within float32
rounding. The micro-batch is ragged (odd lengths, padding, an empty response).
"""

from __future__ import annotations

import datetime
import os

import numpy as np
import pytest
import torch

from rlctl.workers.parallel import ulysses
from support.gloo_ranks import run_ranks

SP = 2
TOL = 1e-5
K = 100   # of 300 tokens: about a third of the sampled tokens fall among them


def _model(seed: int, scale: float = 1.0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         attn_implementation="sdpa")
    model = LlamaForCausalLM(config).float()
    with torch.no_grad():
        model.model.norm.weight.mul_(scale)   # a sharper teacher: distinct top-k log-probs
    return model


def _teacher(model, micro: dict, width: int, sp=None) -> dict:
    from rlctl.workers.roles.teacher import teacher_outputs

    with torch.no_grad():
        return teacher_outputs(model, micro["input_ids"], micro["attention_mask"], width, k=K, sp=sp)


def _student(model, micro: dict, width: int, ids: torch.Tensor, sp=None) -> dict:
    from rlctl.workers.compute.logprob import response_log_probs

    model.zero_grad(set_to_none=True)
    out = response_log_probs(model, micro["input_ids"], micro["attention_mask"], width, gather_ids=ids, pack=False,
                             sp=sp)
    mask = micro["response_mask"]
    loss = -(out["topk_log_prob"].exp().sum(-1) * mask).sum() / mask.sum() - (out["log_prob"] * mask).sum() / mask.sum()
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return {"topk_log_prob": out["topk_log_prob"].detach(), "loss": loss.detach(), "grad": grads}


def _rank_main(rank, init_file, out_dir):
    import torch.distributed as dist
    from worker_fixtures import ragged_batch

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=SP,
                            timeout=datetime.timedelta(seconds=60))
    sp = ulysses.new_groups(SP)
    micro = {k: torch.as_tensor(v) for k, v in ragged_batch(rows=5, prompt_width=7, response_width=6, seed=5).items()}
    width = micro["response_mask"].shape[1]
    teacher = _model(1, scale=6.0)
    one = _teacher(teacher, micro, width)
    split = _teacher(teacher, micro, width, sp=sp)
    results = {f"teacher_{key}": float((one[key].double() - split[key].double()).abs().max()) for key in one}
    results["in_topk_share"] = float(one["in_teacher_topk"].float().sum() / micro["response_mask"].sum())
    student = _model(0)
    a = _student(student, micro, width, one["teacher_topk_ids"])
    b = _student(student, micro, width, one["teacher_topk_ids"], sp=sp)
    dist.all_reduce(b["grad"])
    b["grad"] /= SP   # the S ranks' gradients sum to S x dL/dtheta (rlctl.workers.parallel.ulysses)
    results.update({f"student_{key}": float((a[key] - b[key]).abs().max()) for key in a})
    results["student_grad_scale"] = float(a["grad"].abs().max())
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **results)
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_teacher_pass_and_student_topk_at_sp2_equal_one_rank(tmp_path):
    run_ranks(_rank_main, (str(tmp_path / "pg"), str(tmp_path)), SP)
    for rank in range(SP):
        got = dict(np.load(tmp_path / f"rank{rank}.npz"))
        assert got["teacher_teacher_topk_ids"] == 0 and got["teacher_in_teacher_topk"] == 0, got
        assert got["teacher_teacher_log_prob"] < TOL and got["teacher_teacher_topk_log_prob"] < TOL, got
        assert 0 < got["in_topk_share"] < 1, got   # both answers of in_teacher_topk occur
        assert got["student_topk_log_prob"] < TOL and got["student_loss"] < TOL, got
        assert got["student_grad_scale"] > 1e-3, got
        assert got["student_grad"] < TOL * max(1.0, got["student_grad_scale"]), got
