"""The hf engine's kept KV across multi-turn calls: a turn that continues from the KV kept by the
last call generates exactly what a full re-prefill of the whole context generates (float64, a
context-sensitive tiny model, so a wrong position, mask or cache row changes the tokens), while
prefilling only the new tokens."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from rollout_models import EOS, PAD, load_context_sensitive_model, prompt_batch

from rlctl.multiturn.rollout import _arrange
from rlctl.workers.rollout.hf import HFRolloutEngine


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return load_context_sensitive_model(tiny_model_dir)


def engine(model, eos, **kw):
    return HFRolloutEngine(model, pad_token_id=PAD, eos_token_ids=eos, **kw)


def first_turn(model, eos):
    """Turn 1 of 3 prompts x 2 samples on a kept-KV engine; some rows end at an EOS mid-call (their
    KV is kept before the row leaves the batch), the others run to the limit."""
    kept = engine(model, eos)
    prompts = prompt_batch()
    gen = torch.Generator().manual_seed(3)
    out = kept.generate(prompts, n=2, max_new_tokens=10, generator=gen, kv_store=[10, 11, 12, 13, 14, 15])
    responses = [out["responses"][r, :out["response_length"][r]].tolist() for r in range(6)]
    return kept, [prompts[r // 2] + responses[r] for r in range(6)], out


def next_inputs(histories, seed):
    """Each history plus a few new tokens (a tool answer and the template's glue, say)."""
    gen = torch.Generator().manual_seed(seed)
    return [h + torch.randint(0, 256, (int(torch.randint(1, 6, (1,), generator=gen)),), generator=gen).tolist()
            for h in histories]


@pytest.fixture(scope="module")
def turn_eos(model):
    """An EOS that some rows of the first turn emit (a token row 0 samples at step 4)."""
    probe = engine(model, [-1]).generate(prompt_batch(), n=2, max_new_tokens=10,
                                         generator=torch.Generator().manual_seed(3))
    return [int(probe["responses"][0, 4])]


def test_continuing_from_kept_kv_equals_a_full_prefill(model, turn_eos):
    kept, histories, out = first_turn(model, turn_eos)
    assert len(set(out["response_length"].tolist())) > 1   # rows left the batch at different steps
    inputs = next_inputs(histories, seed=1)
    fresh = engine(model, turn_eos, reuse_kv=False)
    for turn in (2, 3):
        got = kept.generate(inputs, n=1, max_new_tokens=8, greedy=True,
                            kv_lookup=[10, 11, 12, 13, 14, 15], kv_store=[10, 11, 12, 13, 14, 15])
        want = fresh.generate(inputs, n=1, max_new_tokens=8, greedy=True)
        assert np.array_equal(got["responses"], want["responses"]), f"turn {turn}"
        assert np.array_equal(got["response_length"], want["response_length"])
        # only what follows each kept prefix was prefilled: the last sampled token and the new ones
        kept_lengths = [len(h) - 1 for h in histories]
        assert kept.last_stats["kv_reused_tokens"] == sum(kept_lengths)
        assert kept.last_stats["kv_prefill_tokens"] == sum(len(x) - k for x, k in zip(inputs, kept_lengths))
        histories = [x + got["responses"][r, :got["response_length"][r]].tolist() for r, x in enumerate(inputs)]
        inputs = next_inputs(histories, seed=turn)


def test_a_prefix_that_changed_or_a_key_not_kept_is_prefilled_in_full(model, turn_eos):
    kept, histories, _ = first_turn(model, turn_eos)
    inputs = next_inputs(histories, seed=1)
    inputs[0] = [(inputs[0][0] + 1) % 256] + inputs[0][1:]   # row 0's history is not what was kept
    got = kept.generate(inputs, n=1, max_new_tokens=8, greedy=True,
                        kv_lookup=[10, 11, 12, 13, 14, 99], kv_store=[20, 21, 22, 23, 24, 25])
    want = engine(model, turn_eos, reuse_kv=False).generate(inputs, n=1, max_new_tokens=8, greedy=True)
    assert np.array_equal(got["responses"], want["responses"])
    assert kept.last_stats["kv_reused_tokens"] == sum(len(h) - 1 for h in histories[1:5])
    # the store holds the last call's rows only: the first turn's keys are gone
    assert sorted(kept.kept_kv) == [20, 21, 22, 23, 24, 25]
    again = kept.generate(inputs, n=1, max_new_tokens=8, greedy=True, kv_lookup=[10] * 6, kv_store=[-1] * 6)
    assert again["responses"].tolist() == want["responses"].tolist()
    assert kept.last_stats["kv_reused_tokens"] == 0 and kept.kept_kv == {}


@pytest.mark.parametrize("kw", [dict(reuse_kv=False), dict(fast=False)], ids=["reuse-off", "hf-forward"])
def test_engines_that_keep_nothing_generate_the_same(model, turn_eos, kw):
    plain = engine(model, turn_eos, **kw)
    plain.generate(prompt_batch(), n=2, max_new_tokens=10, generator=torch.Generator().manual_seed(3),
                   kv_store=list(range(6)))
    assert plain.kept_kv == {}
    _, histories, _ = first_turn(model, turn_eos)
    inputs = next_inputs(histories, seed=1)
    got = plain.generate(inputs, n=1, max_new_tokens=8, greedy=True, kv_lookup=list(range(6)), kv_store=list(range(6)))
    want = engine(model, turn_eos).generate(inputs, n=1, max_new_tokens=8, greedy=True)
    assert np.array_equal(got["responses"], want["responses"]) and plain.last_stats["kv_reused_tokens"] == 0


def test_engine_sleep_drops_the_kept_kv(model):
    kept, _, _ = first_turn(model, EOS)
    assert len(kept.kept_kv) == 6
    kept.sleep()
    assert kept.kept_kv == {}


def test_conversations_go_back_to_the_rank_that_keeps_their_kv():
    homes = {k: k % 2 for k in range(10)}   # conversations 0..9 alternate between 2 ranks
    keys = [0, 1, 2, 3, 4, 5, 6, 8]         # 7 and 9 ended: rank 0 has 5 left, rank 1 has 3
    order = _arrange(keys, homes, world=2)
    assert len(order) == 8 and len(order) % 2 == 0
    rank0, rank1 = order[:4], order[4:]
    assert all(homes[keys[j]] == 0 for j in rank0)   # one rank-0 conversation had to move ...
    assert sum(1 for j in rank1 if keys[j] % 2 == 0) == 1   # ... to rank 1, which now keeps it
    assert sorted(j for j in order if j is not None) == list(range(8))
    # an odd count: a dummy row (None) evens the shares; new conversations fill the room left
    order = _arrange([0, 2, 4, 100, 101], {0: 0, 2: 0, 4: 1}, world=2)
    assert len(order) == 6 and order.count(None) == 1
    assert order[:3] == [0, 1, 3] and order[3:] == [2, 4, None]
