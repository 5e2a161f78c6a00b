"""The pipeline on a real model: `rlctl train` (recipe grpo-arith-smollm2-cpu, one short step) ->
`rlctl merge` (logits verified against the trained weights) -> `rlctl serve` answering the official
`openai` client. One run feeds every check: a real model's step costs tens of seconds on 2 cores.
"""

from __future__ import annotations

import json

import pytest

from support.cli import rlctl_here
from support.servers import ServerProcess

pytestmark = pytest.mark.slow
# No validation: the recipe's 100 held-out prompts would cost the real model more than its step.
SHORT = ["run.total_steps=1", "run.save_every=1", "data.batch_size=2", "rollout.n=2", "actor.mini_batch_size=2",
         "actor.micro_batch_size=4", "data.max_response_length=6", "data.val_files=[]", "resources.cpus_per_worker=1"]


@pytest.fixture(scope="module")
def trained(smollm2_dir, tmp_path_factory, ray_cluster):
    root = tmp_path_factory.mktemp("real_run")
    assert rlctl_here("init", "proj", "--recipe", "grpo-arith-smollm2-cpu", "--model", smollm2_dir,
                      cwd=root).returncode == 0
    proj = root / "proj"
    assert rlctl_here("data", "prep", "arith", "--val-fraction", "0.25", cwd=proj).returncode == 0
    done = rlctl_here("train", *SHORT, cwd=proj)
    assert done.returncode == 0, done.stderr[-3000:]
    return proj


def test_one_grpo_step_trains_the_real_model(trained):
    metrics = [json.loads(line) for line in (trained / "runs" / "grpo-arith-smollm2-cpu" / "metrics.jsonl")
               .read_text().splitlines()]
    assert len(metrics) == 1 and metrics[0]["data/sequences"] == 4
    assert 0.0 <= metrics[0]["reward/mean"] <= 1.0 and metrics[0]["actor/grad_norm"] >= 0   # 0 when a group ties
    run = trained / "runs" / "grpo-arith-smollm2-cpu"
    assert (run / "checkpoints" / "LATEST").read_text().strip() == "step_1"


def test_merge_verifies_and_serve_answers_the_openai_client(trained):
    openai = pytest.importorskip("openai")
    out = trained / "merged"
    done = rlctl_here("merge", "runs/grpo-arith-smollm2-cpu", "--to-hf", out, cwd=trained)
    assert done.returncode == 0, done.stderr[-2000:]
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == 49152
    assert (out / "chat_template.jinja").is_file() or "chat_template" in (out / "tokenizer_config.json").read_text()
    server = ServerProcess([str(out), "--engine", "hf", "--port", "0"], timeout_s=180)
    try:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=120)
        reply = client.chat.completions.create(model="merged", max_tokens=12, temperature=0, messages=[
            {"role": "user", "content": "What is 7+10? Reply with digits only."}])
        assert "17" in reply.choices[0].message.content
    finally:
        server.stop()
