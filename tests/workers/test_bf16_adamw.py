"""AdamW with bfloat16 moments (actor.optimizer_state_dtype = "bfloat16"), in one process: its update
against torch's AdamW, the stochastic rounding that keeps the second moment moving, and a checkpoint
that resumes bit-exactly."""

from __future__ import annotations

import torch
from worker_fixtures import ragged_batch

from rlctl.runtime import Batch
from rlctl.workers.compute.bf16_adamw import BF16StateAdamW, stochastic_bf16
from rlctl.workers.compute.engine import OptimSpec, TrainEngine
from rlctl.workers.compute.logprob import response_log_probs

T = 5


def test_update_follows_torch_adamw_with_half_the_state_bytes():
    torch.manual_seed(0)
    start = torch.randn(3, 5000)
    ours, theirs = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    opt_ours = BF16StateAdamW([ours], lr=1e-3, weight_decay=0.1)
    opt_theirs = torch.optim.AdamW([theirs], lr=1e-3, weight_decay=0.1)
    for step in range(20):
        grad = torch.randn(3, 5000, generator=torch.Generator().manual_seed(step))
        for p, opt in ((ours, opt_ours), (theirs, opt_theirs)):
            p.grad = grad.clone()
            opt.step()
    state = opt_ours.state[ours]
    assert state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.bfloat16
    assert set(state) == set(opt_theirs.state[theirs])        # the same state_dict keys as torch's AdamW
    with torch.no_grad():
        moved, apart = (theirs - start).abs(), (ours - theirs).abs()
    assert float(moved.mean()) > 2e-3                           # a random walk of 20 steps of ~lr
    assert float(apart.max()) < 0.01 * float(moved.max())   # measured 0.5%


def test_second_moment_keeps_rising_where_rounding_to_nearest_stalls():
    """g = 1 every step: v -> 1 - 0.999^t. Rounded to nearest in bf16, v stops near 0.5, where its
    0.1% step falls under half a bfloat16 spacing; rounded stochastically it follows the float32 value."""
    p = torch.nn.Parameter(torch.zeros(4096))
    opt = BF16StateAdamW([p], lr=0.0, weight_decay=0.0)
    for _ in range(2000):
        p.grad = torch.ones(4096)
        opt.step()
    want = 1 - 0.999 ** 2000                                    # 0.865
    assert abs(float(opt.state[p]["exp_avg_sq"].float().mean()) - want) < 0.01


def test_stochastic_rounding_is_unbiased_and_lands_on_a_neighbour():
    x = torch.full((100_000,), 1.0 + 2 ** -10)                  # a quarter of the way from 1 to the next bf16
    out = stochastic_bf16(x, torch.Generator().manual_seed(0)).float()
    assert set(out.unique().tolist()) == {1.0, 1.0 + 2 ** -7}
    assert abs(float(out.mean()) - (1.0 + 2 ** -10)) < 2e-4
    assert torch.equal(stochastic_bf16(-x, torch.Generator().manual_seed(0)).float(), -out)   # either sign


def _engine(model_dir):
    from rlctl.config.schema import ModelConfig
    from rlctl.workers.compute.models import load_causal_lm

    torch.set_num_threads(1)
    spec = OptimSpec(lr=1e-2, weight_decay=0.01, grad_clip=1.0, warmup_steps=0, total_steps=10,
                     state_dtype="bfloat16")
    return TrainEngine(load_causal_lm(ModelConfig(path=str(model_dir))), spec, compute_dtype=torch.float32)


def _step(engine, seed):
    micros = [m.to_torch() for m in Batch(ragged_batch(rows=4, response_width=T, seed=seed)).split(2)]

    def loss_fn(micro):
        out = response_log_probs(engine.module, micro["input_ids"], micro["attention_mask"], T)
        return -(out["log_prob"] * micro["response_mask"]).sum() / micro["response_mask"].sum(), {}

    engine.train_mini_batch(micros, loss_fn)
    engine.end_train_step()


def test_checkpoint_resumes_bit_exactly(tiny_model_dir, tmp_path):
    from rlctl.workers.compute.checkpoint_io import load_engine, save_engine

    straight = _engine(tiny_model_dir)
    for seed in range(3):
        _step(straight, seed)
    first = _engine(tiny_model_dir)
    for seed in range(2):
        _step(first, seed)
    save_engine(first, tmp_path / "ckpt")
    resumed = _engine(tiny_model_dir)
    load_engine(resumed, tmp_path / "ckpt")
    assert all(s["exp_avg_sq"].dtype == torch.bfloat16 for s in resumed.optimizer.state.values())
    _step(resumed, 2)
    for (name, a), (_, b) in zip(straight.module.named_parameters(), resumed.module.named_parameters()):
        assert torch.equal(a, b), name
