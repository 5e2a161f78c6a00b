"""`rlctl eval` scores with the run's model-based reward sources: a reward model and a remote service."""

from __future__ import annotations

import shutil
import textwrap

import pytest
from support.reward_server import RewardService, lowercase_share

from rlctl.serve.eval import EvalOptions, run_eval


def test_eval_scores_with_reward_model_plus_remote_service(tiny_model_dir, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rlctl.data.arith import generate
    from rlctl.data.schema import arrow_schema
    from rlctl.models.tiny import build_tiny_reward_model

    rows = generate(seed=0)["test"][:3]
    data = tmp_path / "eval.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema()), data)
    build_tiny_reward_model(tmp_path / "rm", seed=5)
    model = tmp_path / "merged"
    shutil.copytree(tiny_model_dir, model)
    with RewardService() as service:
        (model / "rlctl_training.toml").write_text(textwrap.dedent(f"""
            [reward]
            model = "{tmp_path / 'rm'}"
            remote_url = "{service.url}"
            weights = {{ model = 1.0, remote = 10.0 }}
        """))
        summary = run_eval(model, data, EvalOptions(n=2, temperature=1.0, max_new_tokens=6, engine="hf"),
                           tmp_path / "out.jsonl")
    import json

    records = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(records) == 6 and "model" in summary["reward"] and "remote" in summary["reward"]
    tok = AutoTokenizer.from_pretrained(tmp_path / "rm")
    rm = AutoModelForSequenceClassification.from_pretrained(tmp_path / "rm", dtype=torch.float32).eval()
    for r in records:
        chat = list(r["prompt"]) + [{"role": "assistant", "content": r["response"]}]
        ids = tok(tok.apply_chat_template(chat, tokenize=False), add_special_tokens=False, return_tensors="pt")
        with torch.no_grad():
            expected = float(rm(**ids).logits[0, 0]) + 10.0 * lowercase_share(r["response"])
        assert r["score"] == pytest.approx(expected, abs=1e-5)
    assert len(service.requests) == 1  # 6 samples: one chunk
