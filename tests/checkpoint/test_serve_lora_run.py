"""`rlctl serve RUN_DIR` of a LoRA run: the base model under its own name and the run's adapter,
unmerged, under the run's name (the same adapter `rlctl merge --lora adapter` writes)."""

from __future__ import annotations

import signal

import pytest
from support.lora_adapters import peft_greedy
from support.servers import ServerProcess

from rlctl.checkpoint.merge import merge_run

pytestmark = pytest.mark.slow   # starts Ray, trains a run or starts a subprocess


def test_serving_a_lora_run_folder_serves_its_adapter_by_the_runs_name(trained_runs, tmp_path):
    openai = pytest.importorskip("openai")
    run = trained_runs["lora-untied-1w"]
    adapter = merge_run(run.run_dir, tmp_path / "adapter", lora="adapter").out
    srv = ServerProcess([str(run.run_dir), "--engine", "hf", "--port", "0"])
    try:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="x", max_retries=0, timeout=60)
        base_name, run_name = run.model_dir.name, run.run_dir.name
        assert [m.id for m in client.models.list().data] == [base_name, run_name]
        for name, folder in ((run_name, adapter), (base_name, None)):
            r = client.completions.create(model=name, prompt="Once upon", max_tokens=8, temperature=0)
            assert r.choices[0].text == peft_greedy(run.model_dir, folder, "Once upon", 8), name
    finally:
        assert srv.stop(signal.SIGTERM) == 0
