"""Helpers for the worker tests: a ragged [prompt ++ response] batch and run configs."""

from __future__ import annotations

import numpy as np

PAD = 259  # the tiny tokenizer's <|pad|>


def ragged_batch(rows: int = 8, prompt_width: int = 6, response_width: int = 5, seed: int = 0) -> dict:
    """Left-padded prompts ++ right-padded responses of random real lengths (some responses empty)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, 256, size=(rows, prompt_width + response_width))
    mask = np.zeros_like(ids)
    for r in range(rows):
        p = int(rng.integers(1, prompt_width + 1))
        t = 0 if r == 1 else int(rng.integers(1, response_width + 1))  # row 1: empty response
        mask[r, prompt_width - p:prompt_width + t] = 1
    ids = np.where(mask == 1, ids, PAD)
    return {"input_ids": ids.astype(np.int64), "attention_mask": mask.astype(np.int64),
            "response_mask": mask[:, prompt_width:].astype(np.float32),
            "advantages": rng.normal(size=(rows, response_width)).astype(np.float32)}


def run_config(model_dir, **sections):
    """A Config for the tiny model; `sections` = {"actor": {...}, ...} overrides."""
    import dataclasses

    from rlctl.config import schema

    cfg = schema.Config(model=schema.ModelConfig(path=str(model_dir)))
    for name, values in sections.items():
        current = getattr(cfg, name)
        nested = {k: dataclasses.replace(getattr(current, k), **v) for k, v in values.items() if isinstance(v, dict)}
        flat = {k: v for k, v in values.items() if not isinstance(v, dict)}
        cfg = dataclasses.replace(cfg, **{name: dataclasses.replace(current, **flat, **nested)})
    return cfg


def needs(*, reference: bool = False, critic: bool = False):
    """What start_workers starts for a test's run: the reference model and the critic, or not."""
    from rlctl.algorithms.registry import Needs

    return Needs(critic=critic, reference=reference, greedy_baseline=False, min_group_size=1)
