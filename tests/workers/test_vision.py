"""Vision inputs through the rollout and the update (rlctl.workers.compute.vision) on a tiny Qwen2.5-VL.

The proofs: the log-probs the trainer computes from the batch equal the ones the hf engine
sampled with (rows with two images, one image and none, n samples each), and the same check
fails when the batch loses its images or its M-RoPE positions; the pack layout gives what the
trim layout gives; LoRA's default and model.freeze_vision_tower leave the vision tower alone.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rlctl.runtime.batch import Batch, object_array
from rlctl.runtime.policy import rollout_batch
from rlctl.workers.compute.logprob import batched_response_outputs
from rlctl.workers.compute.vision import has_vision_tower, language_model_linears, vision_tower
from rlctl.workers.rollout import hf as hf_engine

N, T = 2, 6


@pytest.fixture
def tiny_vlm(tiny_vlm_dir):
    """`rlctl model tiny --arch qwen2_5_vl` in float32, eval mode."""
    from transformers import AutoModelForImageTextToText

    return AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir, dtype=torch.float32).eval()


def _prompt(model, images: list[int], head: list[int]) -> list[int]:
    """head ++ (vision_start, image_pad x tokens, vision_end) per image ++ three text tokens."""
    cfg = model.config
    ids = list(head)
    for tokens in images:
        ids += [cfg.vision_start_token_id] + [cfg.image_token_id] * tokens + [cfg.vision_end_token_id]
    return ids + [10, 11, 12]


def _rows(model):
    """Three prompts: two images (grids 1x2x4 and 1x4x4: 2 and 4 tokens after the 2x2 merge),
    none, one; random patches."""
    cfg = model.config.vision_config
    width = cfg.in_channels * cfg.temporal_patch_size * cfg.patch_size ** 2
    rng = np.random.default_rng(0)
    prompts = [_prompt(model, [2, 4], [7, 8]), [7, 8, 9, 10, 11], _prompt(model, [2], [9])]
    grids = [np.array([[1, 2, 4], [1, 4, 4]]), None, np.array([[1, 2, 4]])]
    pixels = [rng.standard_normal((24, width), dtype=np.float32), None, rng.standard_normal((8, width), dtype=np.float32)]
    return prompts, pixels, grids


def _sampled_log_probs(monkeypatch, model, prompts, pixels, grids):
    """Generate with the hf engine, recording log softmax(logits)[sampled token] at every step:
    the rows alive at step t are those longer than t, in order (the engine drops finished rows)."""
    seen = {}
    real = hf_engine.sample_tokens

    def spy(logits, **kwargs):
        tokens = real(logits, **kwargs)
        seen[len(seen)] = torch.log_softmax(logits.float(), -1).gather(-1, tokens[:, None])[:, 0]
        return tokens

    monkeypatch.setattr(hf_engine, "sample_tokens", spy)
    engine = hf_engine.HFRolloutEngine(model, pad_token_id=0, eos_token_ids=[model.config.text_config.eos_token_id or 1])
    out = engine.generate(prompts, n=N, max_new_tokens=T, generator=torch.Generator().manual_seed(1),
                          images={"pixel_values": pixels, "image_grid_thw": grids})
    lengths = out["response_length"]
    rollout = np.zeros((len(lengths), T), np.float32)
    for step, values in seen.items():
        rollout[np.flatnonzero(lengths > step), step] = values.numpy()
    return out, rollout


def _prompt_rows(prompts, pixels, grids) -> Batch:
    width = max(map(len, prompts))
    ids, mask = np.zeros((len(prompts), width), np.int64), np.zeros((len(prompts), width), np.int64)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):], mask[i, width - len(p):] = p, 1
    return Batch({"input_ids": ids, "attention_mask": mask, "pixel_values": object_array(pixels),
                  "image_grid_thw": object_array(grids)})


def _batch(prompts, pixels, grids, out) -> Batch:
    rows = _prompt_rows(prompts, pixels, grids)
    return rollout_batch(rows, out, N, width=rows["input_ids"].shape[1] + 3, pad=0)


def _log_probs(model, batch: Batch, pack: bool | None = None) -> np.ndarray:
    from rlctl.workers.compute.logprob import response_log_probs

    with torch.no_grad():
        return batched_response_outputs(model, torch.device("cpu"), batch, 4,
                                         forward=lambda *a, **k: response_log_probs(*a, pack=pack, **k))["log_prob"]


def test_training_log_probs_equal_the_rollouts_and_dropping_vision_inputs_is_caught(monkeypatch, tiny_vlm):
    prompts, pixels, grids = _rows(tiny_vlm)
    out, rollout = _sampled_log_probs(monkeypatch, tiny_vlm, prompts, pixels, grids)
    batch = _batch(prompts, pixels, grids, out)
    assert batch["position_ids"].shape == (3 * N, 3, batch["input_ids"].shape[1])
    assert batch["pixel_values"][0] is batch["pixel_values"][1]   # a prompt's n samples share its images
    mask = batch["response_mask"] != 0
    assert np.abs(_log_probs(tiny_vlm, batch) - rollout)[mask].max() < 1e-5
    assert np.abs(_log_probs(tiny_vlm, batch, pack=True) - rollout)[mask].max() < 1e-5

    no_images = Batch({k: v for k, v in batch.tensors.items() if k not in ("pixel_values", "image_grid_thw")})
    flat = Batch(dict(batch.tensors))   # 1-D positions: what the model falls back to without its token types
    flat["position_ids"] = np.repeat(np.maximum(np.cumsum(batch["attention_mask"], 1) - 1, 0)[:, None], 3, 1)
    image_rows = np.repeat([True, False, True], N)
    for broken in (no_images, flat):
        diff = np.abs(_log_probs(tiny_vlm, broken) - rollout)[mask & image_rows[:, None]].max()
        assert diff > 1e-4
    text_only = np.abs(_log_probs(tiny_vlm, flat) - rollout)[mask & ~image_rows[:, None]].max()
    assert text_only < 1e-5   # a row without images has 1-D positions anyway


def test_an_entropy_bonus_on_a_vlm_has_finite_gradients(tiny_vlm):
    """The placeholders the policy may not sample are masked with a finite logit: -inf made the
    entropy bonus's gradient NaN (0 * -inf in backward), and every step was skipped."""
    from rlctl.workers.compute.logprob import response_log_probs

    prompts, pixels, grids = _rows(tiny_vlm)
    out = hf_engine.HFRolloutEngine(tiny_vlm, pad_token_id=0, eos_token_ids=[1]).generate(
        prompts, n=1, max_new_tokens=3, generator=torch.Generator().manual_seed(0),
        images={"pixel_values": pixels, "image_grid_thw": grids})
    rows = _prompt_rows(prompts, pixels, grids)
    batch = rollout_batch(rows, out, 1, width=rows["input_ids"].shape[1], pad=0)
    from rlctl.workers.compute.vision import model_inputs

    t = batch.to_torch(keys=["input_ids", "attention_mask"])
    lp = response_log_probs(tiny_vlm, t["input_ids"], t["attention_mask"], 3, with_entropy=True, entropy_grad=True,
                            vision=model_inputs(batch, torch.device("cpu")))
    (lp["entropy"].sum() - lp["log_prob"].sum()).backward()
    grads = [p.grad for p in tiny_vlm.parameters() if p.grad is not None]
    assert grads and all(bool(torch.isfinite(g).all()) for g in grads)


def test_lora_default_adapts_the_language_model_and_freeze_keeps_the_tower(tiny_vlm_dir):
    from rlctl.config.schema import LoraConfig, ModelConfig
    from rlctl.workers.compute.models import apply_lora, load_causal_lm
    from rlctl.workers.compute.vision import freeze_vision_tower

    model = load_causal_lm(ModelConfig(path=str(tiny_vlm_dir)))
    assert has_vision_tower(model)
    targets = language_model_linears(model)
    assert targets and all(".language_model." in name for name in targets)
    peft_model = apply_lora(model, LoraConfig(rank=4, alpha=8))
    adapted = [name for name, _ in peft_model.named_parameters() if "lora_" in name]
    assert adapted and not [name for name in adapted if ".visual." in name]

    model = load_causal_lm(ModelConfig(path=str(tiny_vlm_dir)))
    freeze_vision_tower(model)
    trained = [name for name, p in model.named_parameters() if p.requires_grad]
    assert not [name for name in trained if ".visual." in name] and trained
    assert not any(p.requires_grad for p in vision_tower(model).parameters())
