"""Response log-probs, entropy and values without padding compute equal the naive padded ones."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from worker_fixtures import ragged_batch

from rlctl.workers.compute.logprob import make_layout, response_log_probs, response_values

T = 5


@pytest.fixture(scope="module")
def lm(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


def _naive(model, ids, mask):
    """The padded computation: every position, position_ids from the mask (verl's convention)."""
    pos = (mask.cumsum(1) - 1).clamp(min=0)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float()[:, -T - 1:-1]
    logp = torch.log_softmax(logits, -1)
    valid = mask[:, -T:].bool()
    chosen = logp.gather(-1, ids[:, -T:, None]).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return chosen.masked_fill(~valid, 0), entropy.masked_fill(~valid, 0)


@pytest.mark.parametrize("pack", [True, False])
def test_log_probs_match_padded_computation(lm, pack):
    b = ragged_batch(rows=8, response_width=T)
    ids, mask = torch.from_numpy(b["input_ids"]), torch.from_numpy(b["attention_mask"])
    with torch.no_grad():
        want_logp, want_ent = _naive(lm, ids, mask)
        got = response_log_probs(lm, ids, mask, T, with_entropy=True, pack=pack)
    assert torch.allclose(got["log_prob"], want_logp, atol=1e-5, rtol=0)
    assert torch.allclose(got["entropy"], want_ent, atol=1e-5, rtol=0)
    assert (got["log_prob"][1] == 0).all()                      # the row with an empty response


def test_temperature_divides_the_logits(lm):
    b = ragged_batch(rows=3, response_width=T, seed=1)
    ids, mask = torch.from_numpy(b["input_ids"]), torch.from_numpy(b["attention_mask"])
    with torch.no_grad():
        hot = response_log_probs(lm, ids, mask, T, temperature=2.0)["log_prob"]
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        logits = lm(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -T - 1:-1] / 2.0
        want = torch.log_softmax(logits, -1).gather(-1, ids[:, -T:, None]).squeeze(-1) * mask[:, -T:]
    assert torch.allclose(hot, want, atol=1e-5, rtol=0)


def test_layouts_hold_no_padding():
    b = ragged_batch(rows=8, response_width=T)
    ids, mask = torch.from_numpy(b["input_ids"]), torch.from_numpy(b["attention_mask"])
    real = int(mask.sum())
    packed = make_layout(ids, mask, T, pack=True)
    assert packed.input_ids.shape == (1, real) and packed.attention_mask is None
    trimmed = make_layout(ids, mask, T, pack=False)
    assert trimmed.input_ids.shape == (8, int(mask.sum(1).max())) < ids.shape
    assert int(trimmed.attention_mask.sum()) == real
    assert len(packed.targets) == int(mask[:, -T:].sum())      # one prediction per response token


def test_values_sit_at_the_state_before_each_response_token(tiny_model_dir):
    from rlctl.config.schema import ModelConfig
    from rlctl.workers.compute.models import load_value_model

    torch.manual_seed(0)
    critic = load_value_model(str(tiny_model_dir), ModelConfig(path=str(tiny_model_dir))).eval()
    b = ragged_batch(rows=6, response_width=T, seed=2)
    ids, mask = torch.from_numpy(b["input_ids"]), torch.from_numpy(b["attention_mask"])
    with torch.no_grad():
        pos = (mask.cumsum(1) - 1).clamp(min=0)
        naive = critic(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -T - 1:-1, 0]
        naive = naive * mask[:, -T:]
        for pack in (True, False):
            got = response_values(critic, ids, mask, T, pack=pack)
            assert torch.allclose(got, naive, atol=1e-5, rtol=0)
    assert np.isfinite(got.numpy()).all()
