"""GRPO steps of a vision-language policy through the real actor worker (one rank, no Ray): the
shapes-colour rows read with their images by the controller (rlctl.controller.prompts.VisionData),
the worker's processor, generate, old log-probs, the built-in shapes reward, GRPO advantages, the
update. The reward rises within a few steps (the held-out accuracy figures of longer runs are in
docs/vision.md); the update reaches the vision tower; a checkpoint resumed in a fresh worker
continues exactly as the uninterrupted one (same tokens, same log-probs, same weights). PPO
steps with GAE through the actor and the critic worker: the critic sees the images (its values
change with the pixels alone) with the rollout's positions (they equal a plain transformers forward)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

PROMPTS, N, STEPS, SAVE_AFTER = 8, 8, 12, 9


def _config(model_dir: Path, train: Path, prompts: int = PROMPTS, n: int = N, algorithm: str = "grpo"):
    from rlctl.config.schema import (ActorConfig, AlgorithmConfig, Config, CriticConfig, DataConfig, ModelConfig,
                                     RolloutConfig, RunConfig)

    return Config(run=RunConfig(name="vl", seed=0), model=ModelConfig(path=str(model_dir), dtype="float32"),
                  data=DataConfig(train_files=(str(train),), batch_size=prompts, max_prompt_length=128,
                                  max_response_length=6),
                  actor=ActorConfig(lr=1e-2, mini_batch_size=prompts, micro_batch_size=prompts * n, grad_clip=1.0),
                  critic=CriticConfig(lr=1e-2, mini_batch_size=prompts, micro_batch_size=prompts * n),
                  algorithm=AlgorithmConfig(name=algorithm), rollout=RolloutConfig(n=n))


def _prompt_batches(config, tokenizer, steps: int = STEPS):
    from rlctl.controller.prompts import read_rows, render_prompts
    from rlctl.controller.rollout import prompt_batch
    from rlctl.controller.build import vision_data

    files, size = config.data.train_files, config.data.batch_size
    rows = render_prompts(read_rows([Path(f) for f in files])[:size * steps], tokenizer, 128, "error",
                          vision=vision_data(config, files)).rows
    return [prompt_batch(rows[size * s:size * (s + 1)], f"{s}", 0) for s in range(steps)]


def _step(worker, prompts, step: int, critic=None):
    """One GRPO step (the trainer's calls, in-process), or a PPO step with GAE when a `critic`
    worker is given; the rollout rows with their scores (and values)."""
    from rlctl.algorithms import compute_advantages
    from rlctl.rollouts.single import decode_responses
    from rlctl.tasks.shapes import compute_score

    batch = worker.generate(prompts, seed=step)
    batch = batch.union(worker.compute_log_prob(batch))
    texts = decode_responses(batch, worker.tokenizer)
    scores = np.array([compute_score(ds, t, gt)["score"] for ds, t, gt in
                       zip(batch["data_source"], texts, batch["ground_truth"])], np.float32)
    rewards = np.zeros(batch["response_mask"].shape, np.float32)
    rewards[np.arange(len(scores)), batch["response_length"] - 1] = scores
    if critic is not None:
        batch = batch.union(critic.compute_values(batch))
    advantages, returns = compute_advantages(
        "gae" if critic else "grpo", token_level_rewards=torch.from_numpy(rewards),
        response_mask=torch.from_numpy(batch["response_mask"]), group_ids=batch["uid"],
        values=torch.from_numpy(batch["values"]) if critic else None)
    batch["advantages"], batch["scores"], batch["returns"] = advantages.numpy(), scores, returns.numpy()
    if critic is not None:
        batch.meta["critic_metrics"] = critic.update_critic(batch)
    worker.update_actor(batch)
    return batch


@pytest.mark.slow   # trains 12 steps and a resumed copy: the fast tier's heaviest test otherwise
def test_grpo_on_images_raises_the_reward_trains_the_tower_and_resumes_exactly(tiny_vlm_dir, shapes_dir, tmp_path):
    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    config = _config(tiny_vlm_dir, shapes_dir / "train.parquet")
    worker = ActorRolloutRefWorker(config, total_steps=STEPS)
    batches = _prompt_batches(config, worker.tokenizer)
    tower = {n: p.detach().clone() for n, p in worker.actor.module.named_parameters() if ".visual." in n}
    done = [_step(worker, batches[s], s) for s in range(SAVE_AFTER)]
    assert done[0]["position_ids"].shape[1] == 3 and done[0]["pixel_values"][0] is not None
    assert "images" not in done[0]   # the rows carry pixels to the update, not the PIL images
    moved = [n for n, p in worker.actor.module.named_parameters() if ".visual." in n and not torch.equal(p, tower[n])]
    assert moved, "the update must reach the vision tower"
    worker.save_checkpoint(str(tmp_path / "ckpt"))
    done += [_step(worker, batches[s], s) for s in range(SAVE_AFTER, STEPS)]
    rewards = [float(b["scores"].mean()) for b in done]
    assert np.mean(rewards[-4:]) > 2 * np.mean(rewards[:4]) and np.mean(rewards[-4:]) > 0.02, rewards

    resumed = ActorRolloutRefWorker(config, total_steps=STEPS)
    resumed.load_checkpoint(str(tmp_path / "ckpt"))
    again = [_step(resumed, batches[s], s) for s in range(SAVE_AFTER, STEPS)]
    for a, b in zip(done[SAVE_AFTER:], again):
        assert np.array_equal(a["responses"], b["responses"])
        assert np.array_equal(a["old_log_prob"], b["old_log_prob"])
    for (name, p), q in zip(worker.actor.module.named_parameters(), resumed.actor.module.parameters()):
        assert torch.equal(p, q), name


def test_a_vlm_critic_sees_the_images_with_the_rollouts_positions_through_ppo_steps(tiny_vlm_dir, shapes_dir):
    """PPO with GAE on images through the real actor and critic workers: the critic's values are
    finite, change when only the pixels change (it sees the image), and equal a plain transformers
    forward of the same model on the same row (its own processor-style inputs and M-RoPE positions)."""
    from rlctl.workers.compute.vision import token_types
    from rlctl.workers.roles.actor import ActorRolloutRefWorker
    from rlctl.workers.roles.critic import CriticWorker

    config = _config(tiny_vlm_dir, shapes_dir / "train.parquet", prompts=4, n=2, algorithm="gae")
    actor, critic = ActorRolloutRefWorker(config, total_steps=3), CriticWorker(config, total_steps=3)
    head = critic.critic.module.lm_head.weight.detach().clone()
    done = [_step(actor, b, s, critic=critic) for s, b in enumerate(_prompt_batches(config, actor.tokenizer, 3))]
    for batch in done:
        mask = batch["response_mask"] > 0
        assert np.isfinite(batch["values"][mask]).all() and np.abs(batch["values"][mask]).sum() > 0
        assert all(np.isfinite(v) for v in batch.meta["critic_metrics"].values()), batch.meta["critic_metrics"]
    assert not torch.equal(head, critic.critic.module.lm_head.weight), "the value head must train"

    batch = done[-1]
    other = batch.select(np.arange(len(batch["pixel_values"])))   # the same rows, each with another row's image
    other["pixel_values"] = batch["pixel_values"][np.roll(np.arange(len(batch["pixel_values"])), 2)]
    assert not np.array_equal(other["pixel_values"][0], batch["pixel_values"][0])
    values, moved = critic.compute_values(batch)["values"], critic.compute_values(other)["values"]
    mask = batch["response_mask"] > 0
    assert np.abs(values - moved)[mask].max() > 1e-4, "the critic's values must depend on the image"

    model = critic.critic.module
    for row in (0, 3):
        real = batch["attention_mask"][row] > 0
        ids = torch.from_numpy(batch["input_ids"][row][real])[None]
        p_len = int(real[:batch["input_ids"].shape[1] - mask.shape[1]].sum())
        model.model.rope_deltas = None   # the model caches them between calls
        with torch.no_grad():
            plain = model(input_ids=ids, pixel_values=torch.from_numpy(batch["pixel_values"][row]),
                          image_grid_thw=torch.from_numpy(batch["image_grid_thw"][row]),
                          mm_token_type_ids=token_types(model, ids), use_cache=False).logits[0, :, 0]
        want = plain[p_len - 1:p_len - 1 + int(mask[row].sum())].numpy()
        np.testing.assert_allclose(values[row][mask[row]], want, atol=1e-5, rtol=1e-4)
