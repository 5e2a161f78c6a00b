"""The separate rollout group (rollout.mode = "one_step_off" / "async") on a vision-language policy:
real Ray actors, one actor rank and one rollout rank with the tiny Qwen2.5-VL, shapes-colour
prompts with their PIL images as the controller sends them.

The proofs: the rollout rank's rows carry the pixels, grids and M-RoPE positions it sampled
with; its rollout_log_prob equals a plain transformers forward of the same weights on each row's
own processor inputs (no positions given: the model derives them from the image tokens and
grids), so a rank that dropped the images or the positions fails; it samples the very tokens the
actor's own (sync) rollout samples from the same seed; and after an update the pushed weights,
vision tower included, bring the trainer's recomputed log-probs back onto rollout_log_prob."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from worker_fixtures import needs, run_config

ray = pytest.importorskip("ray")

from rlctl.runtime import Batch  # noqa: E402
from rlctl.runtime.ray_env import ray_session  # noqa: E402
from rlctl.workers.roles.groups import start_workers  # noqa: E402

pytestmark = pytest.mark.slow   # starts Ray, trains a run or starts a subprocess

PROMPTS, N, T = 4, 2, 4


def _prompts(config, tokenizer) -> Batch:
    """The first PROMPTS shapes-colour rows as the controller's prompt batch (PIL `images` column)."""
    from rlctl.controller.prompts import read_rows, render_prompts
    from rlctl.controller.rollout import prompt_batch
    from rlctl.controller.build import vision_data

    files = config.data.train_files
    rows = render_prompts(read_rows([Path(f) for f in files])[:PROMPTS], tokenizer, 128, "error",
                          vision=vision_data(config, files)).rows
    return prompt_batch(rows, "0", 0)


def _plain_log_probs(model, rows: Batch) -> np.ndarray:
    """log pi(response token) [B, T] by transformers' own forward of each row alone: its pixels,
    grids and token types, no position_ids (the model's get_rope_index), placeholders banned."""
    from rlctl.workers.compute.vision import ban_placeholders, placeholder_ids, token_types

    width = rows["responses"].shape[1]
    out = np.zeros(rows["response_mask"].shape, np.float32)
    for r in range(len(rows)):
        real = rows["attention_mask"][r] > 0
        ids = torch.from_numpy(rows["input_ids"][r][real])[None]
        p_len = int(real[:-width].sum())
        t_len = int(rows["response_mask"][r].sum())
        model.model.rope_deltas = None   # the model caches them between calls
        with torch.no_grad():
            logits = model(input_ids=ids, pixel_values=torch.tensor(rows["pixel_values"][r]),
                           image_grid_thw=torch.tensor(rows["image_grid_thw"][r]),
                           mm_token_type_ids=token_types(model, ids), use_cache=False).logits[0]
        logits = ban_placeholders(logits[p_len - 1:p_len - 1 + t_len].float(), placeholder_ids(model))
        out[r, :t_len] = torch.log_softmax(logits, -1).gather(-1, ids[0, p_len:p_len + t_len, None])[:, 0].numpy()
    return out


def test_rollout_rank_samples_from_images_and_its_log_probs_match_the_trainer(tiny_vlm_dir, shapes_dir):
    from transformers import AutoModelForImageTextToText

    from rlctl.models.loading import load_tokenizer

    cfg = run_config(tiny_vlm_dir, model={"dtype": "float32"},
                     actor={"lr": 5e-2, "micro_batch_size": PROMPTS * N, "mini_batch_size": PROMPTS, "grad_clip": 0.0},
                     rollout={"n": N, "mode": "one_step_off"},
                     data={"batch_size": PROMPTS, "max_response_length": T, "max_prompt_length": 128,
                           "train_files": (str(shapes_dir / "train.parquet"),)},
                     resources={"gpus_per_node": 0, "workers": 1, "rollout_workers": 1})
    prompts = _prompts(cfg, load_tokenizer(str(tiny_vlm_dir)))
    assert "images" in prompts and all(len(i) == 1 for i in prompts["images"])
    plain = AutoModelForImageTextToText.from_pretrained(tiny_vlm_dir, dtype=torch.float32).eval()
    with ray_session(num_cpus=2):
        workers = start_workers(cfg, total_steps=2, needs=needs())
        actor, rollout = workers.actor, workers.rollout
        weights = actor.export_weights()
        assert any(".visual." in name for name in weights), "the push must carry the vision tower"
        rollout.update_weights(weights, version=0)

        rows = rollout.generate(prompts, seed=3)
        mask = rows["response_mask"]
        assert "images" not in rows and rows["position_ids"].shape == (PROMPTS * N, 3, rows["input_ids"].shape[1])
        assert all(p is not None and len(p) for p in rows["pixel_values"])
        # the rows' log-probs under v0 by an independent forward: images and positions were used
        np.testing.assert_allclose(rows["rollout_log_prob"] * mask, _plain_log_probs(plain, rows) * mask, atol=2e-5)
        # the actor's own rollout from the same seed and weights samples the same tokens
        sync = actor.generate(prompts, seed=3)
        assert np.array_equal(sync["responses"], rows["responses"])
        assert np.array_equal(sync["position_ids"], rows["position_ids"])
        recomputed = actor.compute_log_prob(rows)["old_log_prob"]
        assert np.abs(recomputed - rows["rollout_log_prob"])[mask > 0].max() < 1e-5

        # the images matter to these numbers: another row's pixels give other log-probs
        other = rows.select(np.arange(len(rows)))
        other["pixel_values"] = rows["pixel_values"][np.roll(np.arange(len(rows)), N)]
        assert np.abs(rollout.tag_rollout(other)["rollout_log_prob"] - rows["rollout_log_prob"])[mask > 0].max() > 1e-4

        # an update moves the trainer (tower included) away from the rollout copy; a push brings it back
        train = Batch(dict(rows.tensors), {"mini_batches": 1})
        train["advantages"] = np.where(mask > 0, np.random.default_rng(0).normal(size=mask.shape), 0).astype(np.float32)
        actor.update_actor(train)
        pushed = actor.export_weights()
        assert any(not np.array_equal(pushed[k], weights[k]) for k in pushed if ".visual." in k)
        assert np.abs(actor.compute_log_prob(rows)["old_log_prob"] - rows["rollout_log_prob"])[mask > 0].max() > 1e-3
        rollout.update_weights(pushed, version=1)
        fresh = rollout.generate(prompts, seed=4)
        assert (fresh["policy_version"] == 1).all()
        drift = np.abs(actor.compute_log_prob(fresh)["old_log_prob"] - fresh["rollout_log_prob"])
        assert drift[fresh["response_mask"] > 0].max() < 1e-5
        workers.shutdown()
