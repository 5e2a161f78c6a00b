"""The hf engine on an FSDP2-sharded model: two real gloo ranks, each generating a different
number of rows and decode steps (a per-step all-gather would deadlock here), then training."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from rollout_models import NEVER, PAD, load_context_sensitive_model, prompt_batch

from rlctl.workers.rollout.hf import HFRolloutEngine
from support.gloo_ranks import run_ranks

pytestmark = pytest.mark.slow   # starts Ray, trains a run or starts a subprocess

WORLD = 2
# rank 0: 3 prompts, no EOS -> 12 decode steps; rank 1: 1 prompt, EOS on a third of the
# vocabulary -> rows stop after a few steps. Different shapes and step counts per rank.
RANK_JOBS = [dict(lengths=(9, 14, 4), seed=0, eos=NEVER), dict(lengths=(6,), seed=1, eos=list(range(0, 260, 3)))]
TRAIN_IDS = [[5, 17, 99, 3, 42, 7], [60, 61, 62, 63, 64, 65]]


def generate_both(engine, job):
    prompts = prompt_batch(job["lengths"], job["seed"])
    greedy = engine.generate(prompts, n=2, max_new_tokens=12, greedy=True)
    sampled = engine.generate(prompts, n=2, max_new_tokens=12, temperature=0.8,
                              generator=torch.Generator().manual_seed(3))
    return greedy, sampled


def train_loss(model, rank):
    return model(input_ids=torch.tensor([TRAIN_IDS[rank]])).logits.float().logsumexp(-1).mean()


def _rank_main(rank, model_dir, init_file, out_dir, fast):
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    model = load_context_sensitive_model(model_dir)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    job = RANK_JOBS[rank]
    engine = HFRolloutEngine(model, pad_token_id=PAD, eos_token_ids=job["eos"], fast=fast)
    greedy, sampled = generate_both(engine, job)
    sharded = all(isinstance(p, DTensor) for p in model.parameters())
    loss = train_loss(model, rank)  # the training path (all-gathers, backward) still works
    loss.backward()
    again, _ = generate_both(engine, job)  # and generation after a backward pass
    np.savez(os.path.join(out_dir, f"rank{rank}.npz"), greedy=greedy["responses"],
             lengths=greedy["response_length"], sampled=sampled["responses"], again=again["responses"],
             sharded=sharded, loss=loss.item())
    dist.destroy_process_group()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("fast", [True, False], ids=["decoder-runner", "hf-forward"])
def test_fsdp2_ranks_with_different_step_counts_generate_like_the_plain_model(tiny_model_dir, tmp_path, fast):
    # hf-forward runs FSDP's own forward hooks on every step: they must stay collective-free
    run_ranks(_rank_main, (str(tiny_model_dir), str(tmp_path / "pg"), str(tmp_path), fast), WORLD)
    model = load_context_sensitive_model(tiny_model_dir)
    for rank, job in enumerate(RANK_JOBS):
        got = np.load(tmp_path / f"rank{rank}.npz")
        greedy, sampled = generate_both(HFRolloutEngine(model, pad_token_id=PAD, eos_token_ids=job["eos"]), job)
        assert np.array_equal(got["greedy"], greedy["responses"])
        assert np.array_equal(got["sampled"], sampled["responses"])
        assert np.array_equal(got["again"], greedy["responses"])
        assert bool(got["sharded"]), "parameters must be resharded after generate"
        with torch.no_grad():
            assert got["loss"] == pytest.approx(train_loss(model, rank).item(), rel=1e-12)
    steps = [np.load(tmp_path / f"rank{r}.npz")["lengths"].max() for r in range(WORLD)]
    assert steps[0] == 12 and steps[1] < 12  # the ranks really ran different step counts
