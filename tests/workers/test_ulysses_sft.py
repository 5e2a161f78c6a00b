"""SFT's loss under Ulysses sequence parallelism on two real gloo ranks against one rank.

Both ranks hold the same micro-batch of right-padded rows of odd real lengths whose prompts carry
no loss (loss_mask 0), as rlctl.data.sft makes them. With sp = 2 each rank runs half of the packed
row (rlctl.workers.roles.sft.target_nll with the sp group); the per-token NLL, the mean loss and the
summed gradients must equal the plain one-rank forward (trim layout, SDPA) within float32 rounding,
for KV heads that split over the ranks and a KV head repeated (1 KV head, sp = 2). A micro-batch
whose targets all sit in rank 0's half (rank 1 has none to predict) still gets the same numbers.
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


def _model(kv_heads: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=kv_heads, max_position_embeddings=64,
                         attn_implementation="sdpa")
    return LlamaForCausalLM(config).float()


def sft_rows(lengths: list[int], prompts: list[int], width: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Right-padded rows of the given real lengths; the first `prompts[r]` tokens of row r are its
    prompt (loss_mask 0), the rest its targets."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, 300, size=(len(lengths), width))
    cols = np.arange(width)[None]
    real = cols < np.asarray(lengths)[:, None]
    loss = real & (cols >= np.asarray(prompts)[:, None])
    return {"input_ids": torch.as_tensor(np.where(real, ids, 0)),
            "attention_mask": torch.as_tensor(real.astype(np.int64)),
            "loss_mask": torch.as_tensor(loss.astype(np.float32))}


def _pass(model, micro: dict, sp=None) -> dict:
    from rlctl.workers.roles.sft import target_nll

    model.zero_grad(set_to_none=True)
    nll, rows = target_nll(model, micro["input_ids"], micro["attention_mask"], micro["loss_mask"], pack=False, sp=sp)
    loss = nll.sum() / len(nll)
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return {"nll": nll.detach(), "rows": rows.float(), "loss": loss.detach(), "grad": grads}


def _rank_main(rank, init_file, out_dir):
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=SP,
                            timeout=datetime.timedelta(seconds=60))
    sp = ulysses.new_groups(SP)
    cases = {"ragged": sft_rows([7, 3, 11, 5, 9], [3, 1, 6, 2, 4], width=12, seed=1),    # 35 tokens: odd
             "front": sft_rows([11], [0], width=11, seed=2)}                            # targets in rank 0's half only
    cases["front"]["loss_mask"][0, 4:] = 0
    results = {}
    for kv in (2, 1):
        model = _model(kv)
        for name, micro in cases.items():
            one = _pass(model, micro)
            split = _pass(model, micro, sp=sp)
            dist.all_reduce(split["grad"])
            split["grad"] /= SP   # the S ranks' gradients sum to S x dL/dtheta (rlctl.workers.parallel.ulysses)
            for key in one:
                results[f"{name}_kv{kv}_{key}"] = float((one[key] - split[key]).abs().max())
            results[f"{name}_kv{kv}_targets"] = float(len(split["nll"]) - len(one["nll"]))
            results[f"{name}_kv{kv}_grad_scale"] = float(one["grad"].abs().max())
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), **results)
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_sft_loss_and_gradients_at_sp2_equal_one_rank(tmp_path):
    run_ranks(_rank_main, (str(tmp_path / "pg"), str(tmp_path)), SP)
    for rank in range(SP):
        got = dict(np.load(tmp_path / f"rank{rank}.npz"))
        for case in ("ragged", "front"):
            for kv in (2, 1):
                p = f"{case}_kv{kv}"
                assert got[f"{p}_targets"] == 0 and got[f"{p}_rows"] == 0, (rank, p, got)
                assert got[f"{p}_nll"] < TOL and got[f"{p}_loss"] < TOL, (rank, p, got)
                assert got[f"{p}_grad_scale"] > 1e-3, (rank, p, got)   # a real gradient is compared
                assert got[f"{p}_grad"] < TOL * max(1.0, got[f"{p}_grad_scale"]), (rank, p, got)


def test_sft_rows_mask_prompts_and_padding():
    rows = sft_rows([3, 5], [1, 2], width=6)
    assert rows["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 0]]
    assert rows["loss_mask"].tolist() == [[0, 1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 0]]
