"""The MFU count of rlctl.utils.flops (shared with bench/rlctl_bench.py) on hand-computed cases,
the forward-equivalents the trainer counts per algorithm, and the cached matmul peak."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from rlctl.config.schema import Config
from rlctl.controller.perf import StepFlops
from rlctl.utils.flops import ModelShape, forward_flops, matmul_peak, mfu

CFG = {"hidden_size": 8, "num_hidden_layers": 2, "intermediate_size": 16, "num_attention_heads": 2,
       "num_key_value_heads": 1, "vocab_size": 10}


def test_shape_and_forward_flops_by_hand():
    shape = ModelShape.from_hf_config(CFG)
    # per layer: q, o 2*8*8 + k, v 2*8*4 + gate, up, down 3*8*16 = 576; x 2 layers + lm_head 8*10
    assert shape == ModelShape(matmul_params=1232, layers=2, attention_dim=8)
    assert ModelShape.from_hf_config(CFG, lm_head=False).matmul_params == 1152
    assert ModelShape.from_hf_config({**CFG, "head_dim": 8}).attention_dim == 16     # Qwen3-style head_dim
    # 4 rows = 2 prompts x 2 samples: 8 prompt tokens (4 distinct) + 12 response tokens, S = 5
    flops = forward_flops(shape, prompt_tokens=8, response_tokens=12, rows=4, group_size=2)
    assert flops == 2 * 1232 * 16 + 4 * 2 * 2 * 8 * 5 ** 2
    assert mfu(flops, 2.0, flops) == 0.5 and mfu(flops, 0.0, 1.0) == 0.0


def fake_setup(config: Config, *, critic: bool, recompute: bool, reference: bool):
    """The fields StepFlops.measure reads, with role handles answering flops_profile like 2 ranks."""
    profile = SimpleNamespace(flops_profile=lambda: [{"peak_flops": 1e9, "model_config": CFG}] * 2)
    return SimpleNamespace(config=config, actor=profile, critic=profile if critic else None,
                           recompute_old_log_prob=recompute, needs=SimpleNamespace(reference=reference))


def test_forward_equivalents_per_algorithm():
    c = Config()
    grpo = StepFlops.measure(fake_setup(c, critic=False, recompute=False, reference=True))
    assert grpo.actor_passes == 5 and grpo.critic is None and grpo.peak_flops == 2e9
    lora = Config(model=c.model.__class__(path="m", lora=c.model.lora.__class__(rank=8)),
                  actor=c.actor.__class__(ppo_epochs=2))
    flops = StepFlops.measure(fake_setup(lora, critic=False, recompute=True, reference=True))
    assert flops.actor_passes == 1 + 1 + 1 + 2 * 2        # LoRA backward: input gradients only
    ppo = StepFlops.measure(fake_setup(c, critic=True, recompute=False, reference=False))
    assert ppo.actor_passes == 4 and ppo.critic_passes == 4 and ppo.peak_flops == 2e9   # co-located
    apart = Config(resources=c.resources.__class__(colocate=False))
    assert StepFlops.measure(fake_setup(apart, critic=True, recompute=False, reference=False)).peak_flops == 4e9


def test_step_metrics_count_the_trained_batch():
    from rlctl.runtime.batch import Batch

    grpo = StepFlops.measure(fake_setup(Config(), critic=False, recompute=False, reference=True))
    response_mask = np.array([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], np.float32)   # 9 response tokens
    attention = np.concatenate([np.ones((4, 2), np.int64), response_mask.astype(np.int64)], axis=1)
    out = grpo.metrics(Batch({"response_mask": response_mask, "attention_mask": attention}), 0.5)
    expected = 5 * forward_flops(grpo.actor, prompt_tokens=8, response_tokens=9, rows=4, group_size=1)
    assert out == {"perf/mfu": pytest.approx(expected / 0.5 / 2e9), "perf/peak_flops": 2e9}


def test_matmul_peak_is_measured_once_per_process():
    first = matmul_peak("cpu", "float32", size=256)
    assert first > 1e7 and matmul_peak("cpu", "float32", size=256) is first
