"""The compiled decode step (rlctl.workers.rollout.compiled): the eager step's tokens in float32 (greedy
and seeded sampling), its logits within bfloat16 rounding under autocast, and finished rows leaving
without a recompile. One compiled model for the module: inductor compiles a few graphs once."""

from __future__ import annotations

import shutil

import pytest
import torch
from rollout_models import EOS, PAD, prompt_batch

from rlctl.workers.rollout import packed
from rlctl.workers.rollout.decoder import DecoderRunner, left_pad
from rlctl.workers.rollout.hf import HFRolloutEngine

compiles = pytest.mark.skipif(not packed.packing_available(torch.device("cpu"), torch.float32)
                              or not shutil.which("g++"),
                              reason="the compiled decode step needs oneDNN's packed linears and a C++ compiler")

LIMITS = [3, 12, 7]   # per-prompt caps: rows end at different steps, so the live rows shrink twice


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():   # larger layer weights: every token depends on its context (rollout_models)
        for name, p in model.named_parameters():
            if ".layers." in name and p.dim() == 2:
                p.mul_(8.0)
    return model


def _generate(model, compile: str, greedy: bool, seed: int = 3):
    engine = HFRolloutEngine(model, pad_token_id=PAD, eos_token_ids=EOS, compile=compile)
    out = engine.generate(prompt_batch(), n=3, max_new_tokens=12, greedy=greedy, limits=LIMITS,
                          generator=torch.Generator().manual_seed(seed))
    return out, engine.last_stats


def _graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def test_auto_compiles_long_generations_of_wide_models_only(model):
    engine = HFRolloutEngine(model, pad_token_id=PAD, eos_token_ids=EOS, compile="auto")
    assert not engine._compiles(512)   # the test model is 64 wide: too little per step to fuse
    model.config.hidden_size = 576     # SmolLM2-135M's width
    try:
        assert engine._compiles(160) and not engine._compiles(64)
    finally:
        model.config.hidden_size = 64
    assert HFRolloutEngine(model, pad_token_id=PAD, eos_token_ids=EOS, compile="on")._compiles(1)
    assert not HFRolloutEngine(model, pad_token_id=PAD, eos_token_ids=EOS)._compiles(512)   # engines off by default


@pytest.mark.slow   # inductor runs the C++ compiler in a subprocess
@compiles
def test_float32_tokens_are_the_eager_steps_and_rows_leave_without_recompiling(model):
    for greedy in (True, False):
        compiled, stats = _generate(model, "on", greedy)
        eager, eager_stats = _generate(model, "off", greedy)
        assert (compiled["responses"] == eager["responses"]).all()
        assert (compiled["response_length"] == eager["response_length"]).all()
        assert eager_stats["compile_s"] == 0.0
    assert sorted(set(compiled["response_length"].tolist())) == [3, 7, 12]   # rows did leave mid-run
    graphs = _graphs()
    for seed in (4, 5):   # other tokens, the same drops: every graph is already there
        _, stats = _generate(model, "on", greedy=False, seed=seed)
        assert stats["compile_s"] == 0.0
    assert _graphs() == graphs


@pytest.mark.slow
@compiles
def test_bfloat16_logits_agree_within_rounding(model):
    ids, valid = left_pad(prompt_batch(), PAD, torch.device("cpu"))
    steps = []
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        for compile in (True, False):
            runner = DecoderRunner(model, 6, compile=compile)
            logits = runner.prefill(ids, valid, 2)
            tokens = logits.argmax(-1).repeat_interleave(2)   # the same teacher-forced tokens in both
            positions = valid.sum(-1).repeat_interleave(2)
            got = []
            for step in range(5):
                if step == 2:   # a row leaves: the runner's non-contiguous path
                    keep = torch.tensor([0, 1, 2, 3, 5])
                    runner.select(keep)
                    tokens, positions = tokens[keep], positions[keep]
                logits = runner.decode(tokens, positions + step)
                got.append(logits.float())
                tokens = (positions * 7 + step) % 250
            assert (runner.compiled is not None) == compile
            steps.append(got)
    for compiled, eager in zip(*steps):
        torch.testing.assert_close(compiled, eager, rtol=2e-2, atol=3e-2)


def test_the_engines_compile_seconds_reach_the_step_metrics():
    from rlctl.controller.rollout import weight_sync_metrics

    step = weight_sync_metrics({}, {"compile_s": 2.5, "weight_sync_s": 0.5})
    assert weight_sync_metrics(step, {"compile_s": 0.0}) == {"perf/compile_s": 2.5, "perf/weight_sync_s": 0.5}
