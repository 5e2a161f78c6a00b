"""An agent run whose endpoint is served by vLLM's CPU engine (`rollout.engine = "vllm"`): the tool-call
agent of test_endpoint.py trains 2 steps, its two calls merged into one sequence, and the trainer's
log-probs of those merged sequences equal the ones vLLM sampled with, within the bound the run enforces
for vLLM (rollout.max_logprob_diff: a larger drift would stop the run with exit 5).

Real everything: the actor rank's own vLLM engine, the endpoint on loopback, the official client. The tool
caller is trained at test time from a 2 x 64 tiny model with 2 heads (head size 32, which vLLM's CPU
attention runs). Skipped without vllm; a failure under CI=true.
"""

from __future__ import annotations

import json

import pytest
from support.parquet_rows import write_rows
from test_endpoint import AGENTS, calculator_schema

from rlctl.config.loader import load_config
from rlctl.controller.run import start_training
from rlctl.project import write_project

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("vllm_installed")]


def test_a_tool_agent_trains_on_vllm_with_merged_calls_and_matching_log_probs(tmp_path, vllm_tool_model_dir,
                                                                             ray_cluster):
    proj = tmp_path / "proj"
    write_project(proj, "grpo-agent-smollm2-cpu", str(vllm_tool_model_dir))
    (proj / "agents.py").write_text(f"CALC_JSON = {calculator_schema()!r}\n" + AGENTS)
    write_rows(proj / "data" / "train.parquet", [
        {"data_source": "calc", "prompt": [{"role": "user", "content": "What is 2 + 2?"}],
         "reward_model": {"style": "rule", "ground_truth": "4"}, "extra_info": {"index": i}} for i in range(4)])
    start_training(load_config(proj / "rlctl.toml", [
        'data.train_files=["data/train.parquet"]', "data.max_prompt_length=1024", "data.max_response_length=256",
        "data.batch_size=2", "rollout.n=2", "actor.mini_batch_size=2", "actor.micro_batch_size=4",
        "rollout.engine=vllm", "rollout.enforce_eager=true", "rollout.temperature=0.3", "actor.lr=1e-4",
        "rollout.agent.function=agents.py:tool_agent", "run.total_steps=2", "run.save_every=0", "reward.workers=1"]),
        address=None, force=False)
    rows = [json.loads(line) for line in (proj / "runs" / "grpo-agent-smollm2-cpu" / "metrics.jsonl").read_text()
            .splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        assert r["agent/calls"] == 2.0 and r["agent/failed"] == 0.0 and r["agent/tool_calls"] == 1.0
        assert r["agent/merged"] == 1.0 and r["agent/sequences"] == 1.0
        assert r["rollout/logprob_diff_mean"] < 1e-3
