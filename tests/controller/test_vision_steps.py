"""GRPO steps of a vision-language policy through the real actor worker (one rank, no Ray): the
shapes-colour rows read with their images by the controller (rlctl.controller.prompts.VisionData),
the worker's processor, generate, old log-probs, the built-in shapes reward, GRPO advantages, the
update. The reward rises within a few steps (the held-out accuracy figures of longer runs are in
docs/vision.md); the update reaches the vision tower; a checkpoint resumed in a fresh worker
continues exactly as the uninterrupted one (same tokens, same log-probs, same weights)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

PROMPTS, N, STEPS, SAVE_AFTER = 8, 8, 12, 9


def _config(model_dir: Path, train: Path):
    from rlctl.config.schema import ActorConfig, Config, DataConfig, ModelConfig, RolloutConfig, RunConfig

    return Config(run=RunConfig(name="vl", seed=0), model=ModelConfig(path=str(model_dir), dtype="float32"),
                  data=DataConfig(train_files=(str(train),), batch_size=PROMPTS, max_prompt_length=128,
                                  max_response_length=6),
                  actor=ActorConfig(lr=1e-2, mini_batch_size=PROMPTS, micro_batch_size=PROMPTS * N, grad_clip=1.0),
                  rollout=RolloutConfig(n=N))


def _prompt_batches(config, tokenizer):
    from rlctl.controller.prompts import read_rows, render_prompts
    from rlctl.controller.rollout import prompt_batch
    from rlctl.controller.setup import vision_data

    files = config.data.train_files
    rows = render_prompts(read_rows([Path(f) for f in files])[:PROMPTS * STEPS], tokenizer, 128, "error",
                          vision=vision_data(config, files)).rows
    return [prompt_batch(rows[PROMPTS * s:PROMPTS * (s + 1)], f"{s}", 0) for s in range(STEPS)]


def _step(worker, prompts, step: int):
    """One GRPO step (the trainer's calls, in-process); the rollout rows with their scores."""
    from rlctl.algorithms import compute_advantages
    from rlctl.controller.rollout import decode_responses
    from rlctl.tasks.shapes import compute_score

    batch = worker.generate(prompts, seed=step)
    batch = batch.union(worker.compute_log_prob(batch))
    texts = decode_responses(batch, worker.tokenizer)
    scores = np.array([compute_score(ds, t, gt)["score"] for ds, t, gt in
                       zip(batch["data_source"], texts, batch["ground_truth"])], np.float32)
    rewards = np.zeros(batch["response_mask"].shape, np.float32)
    rewards[np.arange(len(scores)), batch["response_length"] - 1] = scores
    advantages, _ = compute_advantages("grpo", token_level_rewards=torch.from_numpy(rewards),
                                       response_mask=torch.from_numpy(batch["response_mask"]), group_ids=batch["uid"])
    batch["advantages"], batch["scores"] = advantages.numpy(), scores
    worker.update_actor(batch)
    return batch


def test_grpo_on_images_raises_the_reward_trains_the_tower_and_resumes_exactly(tiny_vlm_dir, shapes_dir, tmp_path):
    from rlctl.workers.actor import ActorRolloutRefWorker

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
