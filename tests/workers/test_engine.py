"""The training engine in one process (one rank): schedule, clipping, skipped steps, checkpointing,
LoRA reference, gradient checkpointing."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from worker_fixtures import needs, ragged_batch, run_config

from rlctl.runtime import Batch
from rlctl.workers.compute.engine import OptimSpec, TrainEngine, lr_factor
from rlctl.workers.compute.logprob import response_log_probs

T = 5


def test_lr_schedule_warmup_constant_and_cosine():
    spec = OptimSpec(lr=1.0, weight_decay=0.0, grad_clip=1.0, warmup_steps=4, total_steps=14)
    assert [lr_factor(s, spec) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cos = OptimSpec(lr=1.0, weight_decay=0.0, grad_clip=1.0, warmup_steps=4, total_steps=14,
                    schedule="cosine", min_lr_ratio=0.1)
    assert lr_factor(4, cos) == pytest.approx(1.0)
    assert lr_factor(9, cos) == pytest.approx(0.1 + 0.9 * 0.5)      # half way: cos(pi/2) = 0
    assert lr_factor(14, cos) == pytest.approx(0.1) and lr_factor(50, cos) == pytest.approx(0.1)


def _engine(model_dir, *, grad_clip=1.0, gc=False, lr=1e-2):
    from rlctl.config.schema import ModelConfig
    from rlctl.workers.compute.models import load_causal_lm

    torch.set_num_threads(1)
    model = load_causal_lm(ModelConfig(path=str(model_dir)))
    spec = OptimSpec(lr=lr, weight_decay=0.0, grad_clip=grad_clip, warmup_steps=0, total_steps=10)
    return TrainEngine(model, spec, compute_dtype=torch.float32, gradient_checkpointing=gc)


def _nll_loss(engine, scale=1.0):
    """A real token loss: mean negative log-likelihood of the response tokens (times `scale`)."""
    def loss_fn(micro):
        out = response_log_probs(engine.module, micro["input_ids"], micro["attention_mask"], T)
        mask = micro["response_mask"]
        return -(out["log_prob"] * mask).sum() / mask.sum() * scale, {}
    return loss_fn


def _micros(seed=0):
    b = Batch(ragged_batch(rows=4, response_width=T, seed=seed))
    return [m.to_torch() for m in b.split(2)]


def _weights(engine):
    return {k: v.detach().clone() for k, v in engine.module.named_parameters()}


def test_grad_norm_is_reported_before_clipping_and_clipped(tiny_model_dir):
    engine = _engine(tiny_model_dir, grad_clip=1e-3)
    before = _weights(engine)
    loss_fn = _nll_loss(engine)
    for micro in _micros():                        # the same gradient, computed by hand
        loss_fn(micro)[0].backward()
    want = math.sqrt(sum(float(p.grad.pow(2).sum()) for p in engine.params))
    engine.optimizer.zero_grad()
    out = engine.train_mini_batch(_micros(), loss_fn)
    assert out["grad_norm"] == pytest.approx(want, rel=1e-5) and want > 1e-3 and out["skipped"] == 0.0
    moved = max(float((p - before[k]).abs().max()) for k, p in engine.module.named_parameters())
    assert 0 < moved <= 1e-2 * 1.01                # Adam's first step moves each weight by <= lr


def test_non_finite_loss_skips_the_step_and_leaves_weights_unchanged(tiny_model_dir):
    engine = _engine(tiny_model_dir)
    before = _weights(engine)
    out = engine.train_mini_batch(_micros(), _nll_loss(engine, scale=float("nan")))
    assert out["skipped"] == 1.0 and not math.isfinite(out["grad_norm"])
    assert all(torch.equal(p, before[k]) for k, p in engine.module.named_parameters())
    assert not engine.optimizer.state              # no Adam moments from the bad step
    assert engine.train_mini_batch(_micros(), _nll_loss(engine))["skipped"] == 0.0


def test_gradient_checkpointing_changes_memory_not_math(tiny_model_dir):
    plain, ckpt = _engine(tiny_model_dir), _engine(tiny_model_dir, gc=True)
    a = plain.train_mini_batch(_micros(), _nll_loss(plain))
    b = ckpt.train_mini_batch(_micros(), _nll_loss(ckpt))
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
    for (k, p), (_, q) in zip(plain.module.named_parameters(), ckpt.module.named_parameters()):
        assert torch.allclose(p, q, atol=1e-6), k


def test_lora_reference_is_the_base_model_with_adapters_off(tiny_model_dir, tmp_path):
    from rlctl.workers.compute.models import load_causal_lm
    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    torch.set_num_threads(1)
    cfg = run_config(tiny_model_dir, model={"lora": {"rank": 4, "alpha": 8.0}},
                     actor={"lr": 5e-2, "micro_batch_size": 2}, rollout={"n": 2}, data={"batch_size": 2})
    worker = ActorRolloutRefWorker(cfg, total_steps=4, needs=needs(reference=True))
    assert worker.ref is None                      # LoRA: no second copy of the weights
    batch = Batch(ragged_batch(rows=4, response_width=T))
    base = load_causal_lm(cfg.model).eval()
    with torch.no_grad():
        t = batch.to_torch(keys=["input_ids", "attention_mask"])
        want = response_log_probs(base, t["input_ids"], t["attention_mask"], T)["log_prob"].numpy()
    old = worker.compute_log_prob(batch)
    batch = batch.union(old)
    metrics = worker.update_actor(batch)
    assert metrics["actor/optimizer_steps"] == 1 and metrics["actor/skipped_steps"] == 0
    after = worker.compute_log_prob(batch)["old_log_prob"]
    ref = worker.compute_ref_log_prob(batch)["ref_log_prob"]
    assert np.abs(after - old["old_log_prob"]).max() > 1e-3      # the adapters trained
    np.testing.assert_allclose(ref, want, atol=1e-5)              # the base did not
    np.testing.assert_allclose(old["old_log_prob"], want, atol=1e-5)  # LoRA B starts at zero

    from rlctl.checkpoint.trained import load_trained_model

    worker.save_checkpoint(str(tmp_path / "step" / "actor"))
    saved = load_trained_model(tmp_path / "step", cfg)
    with torch.no_grad():
        got = response_log_probs(saved, t["input_ids"], t["attention_mask"], T)["log_prob"].numpy()
    np.testing.assert_allclose(got, after, atol=1e-5)             # saved adapters = trained policy


def test_bfloat16_run_holds_its_reference_in_bfloat16_within_rounding_of_float32(tiny_model_dir):
    """The frozen reference of a bf16 run is held in bf16 (half a float32 copy's bytes; rlctl.workers.compute.
    engine.hold_frozen); its log-probs stay within bf16 rounding of a float32 reference's, and the step-0 KL
    against the policy (float32 masters under autocast) is 0."""
    from rlctl.workers.compute.models import load_causal_lm
    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    torch.set_num_threads(1)
    cfg = run_config(tiny_model_dir, model={"dtype": "bfloat16"}, actor={"micro_batch_size": 2})
    worker = ActorRolloutRefWorker(cfg, total_steps=1, needs=needs(reference=True))
    embeddings = {id(p) for p in worker.ref.module.get_input_embeddings().parameters()}
    held = {(p.dim() >= 2 and id(p) not in embeddings, p.dtype) for p in worker.ref.module.parameters()}
    assert held == {(True, torch.bfloat16), (False, torch.float32)}   # matrices bf16; embeddings, norms float32
    assert {p.dtype for p in worker.actor.module.parameters()} == {torch.float32}   # masters stay float32
    batch = Batch(ragged_batch(rows=8, response_width=T))
    mask = batch["response_mask"] > 0
    with torch.no_grad():
        t = batch.to_torch(keys=["input_ids", "attention_mask"])
        fp32 = response_log_probs(load_causal_lm(cfg.model).eval(), t["input_ids"], t["attention_mask"], T)
    want = fp32["log_prob"].numpy()[mask]
    ref = worker.compute_ref_log_prob(batch)["ref_log_prob"][mask]
    policy = worker.compute_log_prob(batch)["old_log_prob"][mask]   # float32 weights under bf16 autocast
    assert np.abs(ref - want).max() < 0.01 and np.abs(ref - want).mean() < 0.005   # measured 0.0016 / 0.0007
    assert np.abs(ref - want).max() > 0                               # bf16 passes, not float32 ones
    np.testing.assert_array_equal(policy, ref)                        # the same numbers: actor/kl 0 at step 0
