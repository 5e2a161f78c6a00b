"""`rlctl eval` on a tiny parquet: real generation, the real reward runner, metrics recomputed here."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlctl.serve.eval import EvalOptions, pass_at_k, reward_settings, run_eval

RLCTL = [sys.executable, "-c", "import sys; from rlctl.cli.main import main; sys.exit(main())"]
GSM8K = [("Tom has 3 apples and buys 4 more. How many apples?", "7"),
         ("A pen costs 2 dollars. How much do 5 pens cost?", "10"),
         ("What is 12 minus 5?", "7")]


@pytest.fixture(scope="module")
def parquet(tmp_path_factory) -> Path:
    """4 rows of the arith task and 3 GSM8K-style rows, in the verl schema `rlctl data prep` writes."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from rlctl.tasks.arith import generate
    from rlctl.data.schema import arrow_schema

    rows = generate(seed=0)["test"][:4]
    for i, (q, a) in enumerate(GSM8K):
        text = q + " Let's think step by step and output the final answer after \"####\"."
        rows.append({"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": text}],
                     "ability": "math", "reward_model": {"style": "rule", "ground_truth": a},
                     "extra_info": {"split": "test", "index": i, "question": q, "answer": a}})
    path = tmp_path_factory.mktemp("eval_data") / "mixed.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema()), path)
    return path


def _read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_pass_at_k_matches_counting_every_subset():
    for n in range(1, 7):
        for c in range(n + 1):
            outcomes = [True] * c + [False] * (n - c)
            for k in range(1, n + 1):
                subsets = list(itertools.combinations(outcomes, k))
                brute = sum(any(s) for s in subsets) / len(subsets)
                assert pass_at_k(n, c, k) == pytest.approx(brute)


@pytest.mark.slow
def test_eval_cli_scores_with_the_builtins_by_data_source(tiny_model_dir, parquet, tmp_path):
    from rlctl.rewards.builtin import default_compute_score

    out = tmp_path / "gen.jsonl"
    result = subprocess.run([*RLCTL, "eval", str(tiny_model_dir), "--data", str(parquet), "--engine", "hf",
                             "--max-new-tokens", "8", "--out", str(out), "--format", "json"],
                            capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    records = _read_jsonl(out)
    assert len(records) == 7 and summary["all"]["samples"] == 7 and summary["temperature"] == 0
    assert set(summary["sources"]) == {"rlctl/arith", "openai/gsm8k"}
    for r in records:  # the same reward training would give, recomputed here
        expected = default_compute_score(r["data_source"], r["response"], r["ground_truth"])
        assert r["score"] == pytest.approx(expected["score"])
        assert r["correct"] == (expected["acc"] > 0)
        assert r["metrics"]["acc"] == pytest.approx(expected["acc"])   # the reward's own metrics, per sample
        assert r["response_tokens"] <= 8
    for source, metrics in summary["sources"].items():
        mine = [r for r in records if r["data_source"] == source]
        assert metrics["prompts"] == len(mine)
        assert metrics["mean_reward"] == pytest.approx(sum(r["score"] for r in mine) / len(mine))
        assert metrics["accuracy"] == pytest.approx(sum(r["correct"] for r in mine) / len(mine))
        assert metrics["metrics"]["acc"] == pytest.approx(sum(r["metrics"]["acc"] for r in mine) / len(mine))
    assert "pass@1" not in summary["all"]  # n = 1: no pass@k


REWARD = textwrap.dedent("""
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        # Deterministic in the response, so the test can recompute it; about half are "correct".
        return {"score": len(solution_str) / 10.0, "acc": float(sum(map(ord, solution_str)) % 2 == 0)}
""")


@pytest.mark.slow
def test_eval_n_samples_custom_reward_pass_at_k_and_reproducibility(tiny_model_dir, parquet, tmp_path):
    (tmp_path / "reward.py").write_text(REWARD)
    opts = EvalOptions(n=4, temperature=1.0, max_new_tokens=6, engine="hf", seed=3,
                       reward=str(tmp_path / "reward.py") + ":compute_score")
    summary = run_eval(tiny_model_dir, parquet, opts, tmp_path / "a.jsonl")
    records = _read_jsonl(tmp_path / "a.jsonl")
    assert len(records) == 7 * 4
    by_prompt = {}
    for r in records:
        assert r["score"] == pytest.approx(len(r["response"]) / 10.0)
        by_prompt.setdefault(r["index"], []).append(r["correct"])
    assert [len(v) for v in by_prompt.values()] == [4] * 7
    assert len({r["response"] for r in records}) > 7, "the 4 samples of a prompt should differ"
    for k in (1, 2, 4):
        expected = sum(sum(any(s) for s in itertools.combinations(v, k)) / len(list(itertools.combinations(v, k)))
                       for v in by_prompt.values()) / 7
        assert summary["all"][f"pass@{k}"] == pytest.approx(expected)
    assert summary["all"]["mean@4"] == pytest.approx(sum(r["score"] for r in records) / len(records))
    # Same seed, same generations, however the engine batched them (here: 3 rows at a time).
    run_eval(tiny_model_dir, parquet, EvalOptions(**{**opts.__dict__, "max_concurrency": 3}), tmp_path / "b.jsonl")
    assert _read_jsonl(tmp_path / "b.jsonl") == records


@pytest.mark.slow
def test_bad_reward_is_refused_before_generating(tiny_model_dir, parquet):
    result = subprocess.run([*RLCTL, "eval", str(tiny_model_dir), "--data", str(parquet), "--engine", "hf",
                             "--reward", "nope.py:compute_score"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "nope.py" in result.stderr and "generated" not in result.stderr


def test_run_folder_reward_and_lengths_come_from_its_config(tmp_path):
    run = tmp_path / "runs" / "r1"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.resolved.toml").write_text(textwrap.dedent("""
        [run]
        name = "r1"
        output_dir = "runs"
        [data]
        max_response_length = 33
        [reward]
        function = "reward.py:compute_score"
        format_score = 0.25
        timeout_s = 3.0
    """))
    reward, config_dir, max_response = reward_settings(run, None)
    assert (reward.function, reward.format_score, reward.timeout_s) == ("reward.py:compute_score", 0.25, 3.0)
    # Relative paths point into the project the run was started from: <project>/runs/r1.
    assert config_dir == tmp_path.resolve() and max_response == 33
    reward, config_dir, _ = reward_settings(run, "gsm8k")
    assert reward.function == "gsm8k" and reward.format_score == 0.25


@pytest.mark.slow
def test_remote_generation_matches_local_generation(server, tiny_model_dir):
    """The client `eval --engine vllm|sglang` uses, checked against our own server (same engine code)."""
    from rlctl.api.requests import SamplingParams
    from rlctl.serve.generate import generate_local, generate_remote
    from rlctl.serve.source import load_model

    model, tokenizer = load_model(tiny_model_dir, "float32", "cpu")
    prompts = [tokenizer("abc")["input_ids"], tokenizer("hello there")["input_ids"], [1, 2, 3, 4, 5]]
    params = [SamplingParams(max_tokens=6, temperature=1.0, n=2, seed=10 + i) for i in range(3)]
    local = generate_local(model, tokenizer, prompts, params)
    remote = generate_remote(server.base_url, "tiny", prompts, params, api_key="test-key-123", concurrency=3)
    assert [[s.text for s in row] for row in remote] == [[s.text for s in row] for row in local]
    assert all(s.finish_reason in ("stop", "length") for row in remote for s in row)


def test_summary_averages_the_rewards_own_metrics_over_the_samples_that_have_them():
    from rlctl.cli.serve_cmd import _eval_table
    from rlctl.serve.eval import summarize

    metrics = [[{"acc": 1.0, "number": 1.0}, {"acc": 0.0, "number": 1.0}], [{"acc": 0.0}, {"acc": 0.0, "number": 0.0}]]
    out = summarize([[1.0, 0.5], [0.0, 0.0]], [[True, False], [False, False]], 2, metrics=metrics)
    assert out["metrics"] == {"acc": 0.25, "number": pytest.approx(2 / 3)}
    assert "metrics" not in summarize([[1.0]], [[True]], 1)
    table = _eval_table({"n": 2, "temperature": 1.0, "reward": "r", "out": "o.jsonl",
                         "sources": {"s": out}, "all": out})
    assert table.splitlines()[0].split()[-2:] == ["acc", "number"] and "0.6667" in table.splitlines()[1]
