"""Held-out first-letter accuracy of a shapes-colour policy (docs/vision.md, "Learning figures").

The recipe grpo-shapes-cpu answers with one token, the colour's first letter; the built-in reward
scores whole words, so its `acc` stays 0. This greedy-decodes one token per held-out image with
the hf engine (the rollout's own image path) and counts the rows whose letter is the colour's.

    rlctl merge runs/grpo-shapes-cpu --step 300 --to-hf /tmp/shapes-300
    python bench/vision_heldout.py /tmp/shapes-300 data/shapes-colour/test.parquet
"""

from __future__ import annotations

import collections
import sys
from pathlib import Path

import torch


def main(model_dir: str, test_file: str) -> None:
    from transformers import AutoModelForImageTextToText

    from rlctl.config.schema import Config, DataConfig, ModelConfig, RolloutConfig
    from rlctl.controller.prompts import read_rows, render_prompts
    from rlctl.controller.rollout import prompt_batch
    from rlctl.controller.build import vision_data
    from rlctl.models.loading import load_tokenizer
    from rlctl.workers.compute.models import eos_token_ids
    from rlctl.workers.compute.vision import with_pixels
    from rlctl.workers.roles.actor import pad_token_id, sample
    from rlctl.workers.rollout.hf import HFRolloutEngine

    config = Config(model=ModelConfig(path=model_dir), data=DataConfig(image_key="images"))
    tokenizer = load_tokenizer(model_dir)
    eos = eos_token_ids(model_dir, tokenizer)
    pad = pad_token_id(tokenizer, eos)
    rows = render_prompts(read_rows([Path(test_file)]), tokenizer, 512, "error",
                          vision=vision_data(config, (test_file,))).rows
    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    engine = HFRolloutEngine(model, pad_token_id=pad, eos_token_ids=eos)
    letters, right = collections.Counter(), 0
    for start in range(0, len(rows), 50):
        batch = with_pixels(prompt_batch(rows[start:start + 50], "t", pad), model, model_dir)
        with torch.no_grad():
            out = sample(engine, batch, RolloutConfig(), n=1, max_new_tokens=1, temperature=0.0, seed=0, rank=0,
                         device=torch.device("cpu"))
        for ids, truth in zip(out["responses"], batch["ground_truth"]):
            letter = tokenizer.decode(ids[:1]).strip().lower()[:1]
            letters[letter] += 1
            right += letter == str(truth).strip().lower()[:1]
    print(f"held-out first-letter accuracy: {right / len(rows):.1%} of {len(rows)} images; answers {dict(letters)}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
