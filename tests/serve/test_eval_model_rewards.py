"""`rlctl eval` scores with the run's model-based reward sources: a reward model and a remote service."""

from __future__ import annotations

import shutil
import textwrap

import pytest
from support.reward_server import RewardService, lowercase_share

from rlctl.serve.eval import EvalOptions, run_eval


def test_eval_scores_with_reward_model_plus_remote_service(tiny_model_dir, tmp_path, monkeypatch):
    import pyarrow as pa
    import pyarrow.parquet as pq
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rlctl.tasks.arith import generate
    from rlctl.data.schema import arrow_schema
    from rlctl.models.tiny import build_tiny_reward_model

    rows = generate(seed=0)["test"][:3]
    data = tmp_path / "eval.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema()), data)
    build_tiny_reward_model(tmp_path / "rm", seed=5)
    model = tmp_path / "merged"
    shutil.copytree(tiny_model_dir, model)
    import socket

    connects, connect = [], socket.create_connection
    monkeypatch.setattr(socket, "create_connection",
                        lambda address, *a, **kw: connects.append(address) or connect(address, *a, **kw))
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
    port = int(service.url.split(":")[2].split("/")[0])
    assert len([c for c in connects if c[1] == port]) == 2  # one start-up check, one request: checked once
    # the remote service got the prompts as training renders and decodes them
    prompt_ids = AutoTokenizer.from_pretrained(model).apply_chat_template(rows[0]["prompt"], add_generation_prompt=True)
    assert service.requests[0]["prompts"][0] == AutoTokenizer.from_pretrained(model).decode(prompt_ids)


def test_a_missing_reward_model_is_refused_before_generating(tiny_model_dir, tmp_path, monkeypatch):
    from rlctl.errors import DataError
    from rlctl.serve import eval as eval_mod

    model = tmp_path / "merged"
    shutil.copytree(tiny_model_dir, model)
    (model / "rlctl_training.toml").write_text('[reward]\nmodel = "./no-such-rm"\n')
    monkeypatch.setattr(eval_mod, "_generate", lambda *a, **kw: pytest.fail("generated before checking the reward"))
    with pytest.raises(DataError, match=r"reward.model './no-such-rm' is not a folder"):
        run_eval(model, _one_row(tmp_path), EvalOptions(engine="hf"), tmp_path / "out.jsonl")


def _one_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlctl.tasks.arith import generate
    from rlctl.data.schema import arrow_schema

    path = tmp_path / "one.parquet"
    pq.write_table(pa.Table.from_pylist(generate(seed=0)["test"][:1], schema=arrow_schema()), path)
    return path


def test_multi_turn_eval_sends_the_remote_reward_the_prompt_training_sends(tiny_model_dir, tmp_path):
    """query = prompt + response, the prompt rendered with the tools' schemas and decoded as training does
    (multi-turn eval sent an empty prompt)."""
    from transformers import AutoTokenizer

    from rlctl.data.dataset import chat_prompt_ids
    from rlctl.multiturn.tools import FunctionTool
    from rlctl.multiturn.builtin_tools import calculator

    data = _one_row(tmp_path)
    model = tmp_path / "merged"
    shutil.copytree(tiny_model_dir, model)
    with RewardService() as service:
        (model / "rlctl_training.toml").write_text(textwrap.dedent(f"""
            [reward]
            remote_url = "{service.url}"
            [rollout.multi_turn]
            enable = true
            tools = ["calculator"]
            max_turns = 2
        """))
        run_eval(model, data, EvalOptions(max_new_tokens=6, engine="hf"), tmp_path / "out.jsonl")
    import pyarrow.parquet as pq

    tok = AutoTokenizer.from_pretrained(model)
    row = pq.read_table(data).to_pylist()[0]
    expected = tok.decode(chat_prompt_ids(row["prompt"], tok, [FunctionTool(calculator).schema]))
    assert "calculator" in expected
    assert [body["prompts"] for body in service.requests] == [[expected]]


@pytest.mark.slow
@pytest.mark.parametrize("multi_turn", [False, True])
def test_a_prompt_that_fills_the_context_is_refused(tiny_model_dir, tmp_path, multi_turn):
    """Single- and multi-turn eval check the rendered prompts against max_position_embeddings alike."""
    import json

    from rlctl.errors import DataError

    model = tmp_path / "merged"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 16}))
    (model / "rlctl_training.toml").write_text(textwrap.dedent(f"""
        [reward]
        function = "{tmp_path / 'reward.py'}:compute_score"
        [rollout.multi_turn]
        enable = {str(multi_turn).lower()}
        tools = ["calculator"]
    """))
    (tmp_path / "reward.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                        "    return 0.0\n")
    with pytest.raises(DataError, match=r"prompt 0 has \d+ tokens; the model's context is 16"):
        run_eval(model, _one_row(tmp_path), EvalOptions(engine="hf"), tmp_path / "out.jsonl")
