"""The benchmark's phase floors (rlctl.utils.roofline) on a hand-computed case."""

from __future__ import annotations

import pytest

from rlctl.utils.flops import ModelShape
from rlctl.utils.roofline import MemoryShape, decode_steps, generation_floor, pass_floor, read_bandwidth

CFG = {"hidden_size": 8, "num_hidden_layers": 2, "intermediate_size": 16, "num_attention_heads": 2,
       "num_key_value_heads": 1, "vocab_size": 10, "tie_word_embeddings": True}
# 2 prompts x 2 samples: prompts of 3 and 5 tokens, responses of 1, 3 | 2, 2 tokens
PROMPTS, RESPONSES = [3, 3, 5, 5], [1, 3, 2, 2]


def test_memory_shape_by_hand():
    m = MemoryShape.from_hf_config(CFG, dtype_bytes=2)
    # matmul weights 1232 (tests/controller/test_perf.py) x 2 bytes; KV: 2 x 2 layers x 1 head x 4 dims x 2 bytes
    assert m == MemoryShape(weight_bytes=2464.0, kv_bytes_per_token=32.0, params=1232)
    assert MemoryShape.from_hf_config({**CFG, "tie_word_embeddings": False}, dtype_bytes=4).params == 1232 + 80


def test_decode_steps_count_live_rows_and_the_kv_they_read():
    # step 1: rows of 3, 2, 2 tokens live, reading 1 own token each + prompts 3 and 5 once, attending to
    # 1 own token each + their prompts 3, 5 and 5; step 2: the 3-token row, its 2 tokens + its prompt's 3
    assert decode_steps(PROMPTS, RESPONSES, 2) == [(3, 11.0, 16.0, 1.0), (1, 5.0, 5.0, 1.0)]
    assert decode_steps(PROMPTS, RESPONSES, 2, ranks=2) == [(3, 11.0, 16.0, 2.0), (1, 5.0, 5.0, 1.0)]   # prompt 2 on rank 1
    with pytest.raises(ValueError):
        decode_steps(PROMPTS, RESPONSES[:3], 2)


def test_each_decode_step_is_bound_by_the_slower_of_flops_and_bytes():
    memory, flops = MemoryShape.from_hf_config(CFG, dtype_bytes=2), ModelShape.from_hf_config(CFG)
    # FLOPs: prefill 2*1232*(3+5) + 2*2*8*(9+25) = 20800; step 1: 2*1232*3 + 4*2*8*16 = 8416; step 2: 2464 + 320 = 2784
    # bytes: prefill 2464 + 32*8 = 2720; step 1: 2464 + 32*(11+3) = 2912; step 2: 2464 + 32*(5+1) = 2656
    slow = generation_floor(memory, flops, PROMPTS, RESPONSES, group_size=2, ranks=1, peak_flops=1e4, bandwidth=1e3)
    assert slow == pytest.approx({"floor_s": 2.72 + 2.912 + 2.656, "flops_s": 2.08 + 0.8416 + 0.2784,
                                  "bytes_s": 2.72 + 2.912 + 2.656, "bytes_bound": 1.0})
    mixed = generation_floor(memory, flops, PROMPTS, RESPONSES, group_size=2, ranks=1, peak_flops=1e4, bandwidth=3e3)
    # prefill FLOP-bound (2.08 s > 0.907 s), both decode steps bandwidth-bound (0.971 > 0.842, 0.885 > 0.278)
    assert mixed["floor_s"] == pytest.approx(2.08 + 2912 / 3e3 + 2656 / 3e3)
    assert mixed["bytes_bound"] == pytest.approx((2912 + 2656) / 3e3 / mixed["floor_s"])
    assert mixed["floor_s"] > max(mixed["flops_s"], mixed["bytes_s"])   # the per-step max beats a max of totals


def test_pass_floor_counts_weights_per_micro_batch_and_the_optimizer_step():
    memory = MemoryShape.from_hf_config(CFG, dtype_bytes=2)
    # training: 3 x 2464 x 2 micro-batches + AdamW 28 x 1232 = 49280 bytes; 3 x 1000 FLOPs
    assert pass_floor(1000, memory, forwards=3, micro_batches=2, optimizer_step=True, peak_flops=1e4,
                      bandwidth=1e3) == pytest.approx(49.28)
    assert pass_floor(1000, memory, forwards=1, micro_batches=2, optimizer_step=False, peak_flops=1e4,
                      bandwidth=1e3) == pytest.approx(4.928)
    assert pass_floor(1000, memory, forwards=1, micro_batches=2, optimizer_step=False, peak_flops=10,
                      bandwidth=1e3) == pytest.approx(100.0)                         # FLOP-bound


def test_read_bandwidth_is_a_positive_rate():
    assert read_bandwidth("cpu", size_mib=8, budget_s=0.05) > 1e8
