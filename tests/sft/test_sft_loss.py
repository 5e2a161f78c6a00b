"""Token-budget micro-batches and packed rows give the loss and the update of one padded batch.

The SFTWorker runs here in-process (one rank, no Ray): the same code a worker group runs.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from rlctl.config.schema import Config
from rlctl.data.sft import SFTSample, collate, tokenize_conversation
from rlctl.models.tiny import build_tokenizer
from rlctl.workers.compute.micro_batches import plan_micro_batches
from rlctl.workers.roles.sft import SFTWorker, target_nll


def config(model_dir, **sft) -> Config:
    c = Config()
    return dataclasses.replace(
        c, model=dataclasses.replace(c.model, path=str(model_dir), dtype="float32"),
        actor=dataclasses.replace(c.actor, lr=1e-3, micro_batch_size=64, weight_decay=0.0),
        sft=dataclasses.replace(c.sft, **sft), run=dataclasses.replace(c.run, kind="sft"))


@pytest.fixture(scope="module")
def batch():
    """12 chats of very different lengths (short sums and long explanations)."""
    tok = build_tokenizer()
    rng = np.random.default_rng(0)
    samples = []
    for i in range(12):
        reply = str(i) if i % 3 else "The answer is " + "very " * int(rng.integers(5, 30)) + str(i)
        ids, mask = tokenize_conversation(tok, [{"role": "user", "content": f"What is {i}+0?"},
                                                {"role": "assistant", "content": reply}])
        mask[0] = 0.0
        samples.append(SFTSample(np.asarray(ids), np.asarray(mask, dtype=np.float32)))
    return collate(samples, tok.pad_token_id)


def test_plan_covers_every_row_within_the_budget():
    lengths = np.array([5, 50, 7, 300, 12, 12, 40, 9])
    groups = plan_micro_batches(lengths, max_tokens=100, max_rows=99)
    assert sorted(i for g in groups for i in g) == list(range(8))
    for g in groups:
        assert len(g) == 1 or len(g) * lengths[g].max() <= 100
    assert [len(g) for g in groups] == [5, 2, 1]      # [5,7,9,12,12] [40,50] [300]
    forced = plan_micro_batches(lengths, max_tokens=100, max_rows=99, count=5)
    assert len(forced) == 5 and sorted(i for g in forced for i in g) == list(range(8))
    assert [len(g) for g in plan_micro_batches(lengths, max_tokens=0, max_rows=3)] == [3, 3, 2]


def test_packed_and_trimmed_rows_give_the_same_nll(tiny_model_dir, batch):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    t = batch.to_torch(torch.device("cpu"), keys=["input_ids", "attention_mask", "loss_mask"])
    with torch.no_grad():
        trimmed, rows_a = target_nll(model, t["input_ids"], t["attention_mask"], t["loss_mask"], pack=False)
        packed, rows_b = target_nll(model, t["input_ids"], t["attention_mask"], t["loss_mask"], pack=True)
    assert torch.equal(rows_a, rows_b) and len(trimmed) == int((batch["loss_mask"][:, 1:] > 0).sum())
    torch.testing.assert_close(packed, trimmed, rtol=1e-5, atol=1e-5)


def test_token_budget_micro_batches_match_one_padded_batch(tiny_model_dir, batch):
    whole = SFTWorker(config(tiny_model_dir, micro_batch_max_tokens=0))      # one micro-batch of 12 rows
    budget = SFTWorker(config(tiny_model_dir, micro_batch_max_tokens=160))   # several, grouped by length
    assert len(budget._micro_batches(batch)) > 2 and len(whole._micro_batches(batch)) == 1
    padded = batch["attention_mask"].size
    real = sum(int(m["attention_mask"].numel()) for m in budget._micro_batches(batch))
    assert real < 0.7 * padded     # grouping by length cut the padding the model runs on
    a, b = whole.train_step(batch), budget.train_step(batch)
    assert a["train/loss"] == pytest.approx(b["train/loss"], rel=1e-6)
    assert a["actor/grad_norm"] == pytest.approx(b["actor/grad_norm"], rel=1e-5)
    for (name, p), q in zip(whole.actor.module.named_parameters(), budget.actor.module.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=name)


def test_validation_keeps_the_token_budget_and_the_nll(tiny_model_dir, batch, monkeypatch):
    """eval_nll cuts micro-batches as training does (sft.micro_batch_max_tokens), with the same per-row NLL."""
    import rlctl.workers.roles.sft as sft

    whole = SFTWorker(config(tiny_model_dir, micro_batch_max_tokens=0))
    budget = SFTWorker(config(tiny_model_dir, micro_batch_max_tokens=160))
    shapes, real = [], sft.target_nll
    monkeypatch.setattr(sft, "target_nll", lambda module, ids, *a, **k: shapes.append(ids.shape) or real(module, ids,
                                                                                                        *a, **k))
    a = whole.eval_nll(batch)
    assert shapes == [(12, batch["input_ids"].shape[1])]
    shapes.clear()
    b = budget.eval_nll(batch)
    assert len(shapes) > 2 and all(rows == 1 or rows * width <= 160 for rows, width in shapes), shapes
    assert np.array_equal(a["targets"], b["targets"]) and (a["nll_sum"] > 0).all()
    np.testing.assert_allclose(a["nll_sum"], b["nll_sum"], rtol=1e-5)
