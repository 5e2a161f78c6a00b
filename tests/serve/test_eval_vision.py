"""`rlctl eval` scores image tasks with the hf engine: each row's images go through the model's
processor as training reads them, and the engine receives every prompt with its own row's image
arrays (the engine's image decoding is tests/serve/test_serve_vision.py's); the shapes reward
scores the answers."""

from __future__ import annotations

import json

import numpy as np
import pytest

from rlctl.cli.main import main

pytestmark = pytest.mark.slow   # starts Ray, trains a run or starts a subprocess


def test_eval_sends_each_rows_image_to_the_engine_and_scores_it(tmp_path, tiny_vlm_dir, shapes_dir, capsys,
                                                                 monkeypatch):
    from rlctl.data.dataset import load_rows
    from rlctl.data.images import load_vision_row
    from rlctl.models.vision import encode_prompt, load_processor
    from rlctl.serve.engine import Engine

    submitted, submit = [], Engine.submit
    monkeypatch.setattr(Engine, "submit", lambda self, request: submitted.append(request) or submit(self, request))
    out = tmp_path / "eval.jsonl"
    assert main(["eval", str(tiny_vlm_dir), "--data", str(shapes_dir / "test.parquet"), "--engine", "hf",
                 "--limit", "3", "--temperature", "0", "--max-new-tokens", "4", "--out", str(out),
                 "--format", "json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["sources"]["rlctl/shapes"]["prompts"] == 3 and set(summary["all"]) >= {"accuracy", "mean_reward"}
    records = [json.loads(line) for line in out.read_text().splitlines()]

    processor = load_processor(tiny_vlm_dir)
    rows = load_rows([shapes_dir / "test.parquet"])[:3]
    assert len(submitted) == len(records) == 3
    for row, request, record in zip(rows, sorted(submitted, key=lambda r: r.index_base), records):
        want = encode_prompt(processor, *load_vision_row(row))
        assert request.prompt_ids == want["input_ids"].tolist()
        assert np.array_equal(request.vision["pixel_values"], want["pixel_values"])
        assert request.vision["image_grid_thw"].tolist() == [[1, 4, 4]]
        assert record["ground_truth"] == row["reward_model"]["ground_truth"] and "score" in record
    pixels = [r.vision["pixel_values"] for r in submitted]
    assert not np.array_equal(pixels[0], pixels[1])   # three different images, not one reused
