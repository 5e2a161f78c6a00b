"""model.lora.sync = "adapter" with rollout.engine = "vllm" on CPU: after every update only the LoRA
tensors reach vLLM (a new adapter name per policy version), and the engine generates with them.

Real everything, as test_vllm_learning.py: `rlctl train` on the shared Ray, vLLM in the actor's process.
Every step's `rollout/logprob_diff_mean` (the engine's log-probs of its samples against the trainer's,
adapter on) stays at float32 noise while the policy moves away from the base model (`actor/kl`,
against the reference, which for LoRA is the base with the adapter off): an engine that missed a push
would sample from an older policy, orders of magnitude further off. `perf/weight_sync_mb` counts what
was sent: the adapter, a few percent of the model. Skipped without vllm; a failure under CI=true.
"""

from __future__ import annotations

import json

import pytest
from test_learning import COMMON, GROUP

from support.dense_reward import DENSE_REWARD

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("vllm_installed")]
STEPS = 4


def test_lora_adapter_sync_reaches_vllm_every_step(tmp_path, vllm_tiny_model_dir, arith_data, ray_cluster):
    from rlctl.config.loader import load_config
    from rlctl.controller.run import start_training
    from rlctl.project import write_project

    write_project(tmp_path, "grpo-gsm8k", str(vllm_tiny_model_dir))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "arith").symlink_to(arith_data)
    (tmp_path / "dense.py").write_text(DENSE_REWARD)
    overrides = COMMON + GROUP + [f"run.total_steps={STEPS}", "rollout.engine=vllm", "rollout.enforce_eager=true",
                                  "model.lora.rank=8", "model.lora.alpha=16", "model.lora.sync=adapter"]
    start_training(load_config(tmp_path / "rlctl.toml", overrides), address=None, force=False)
    rows = [json.loads(line) for line in (tmp_path / "runs" / "grpo-gsm8k" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    drift = [r["rollout/logprob_diff_mean"] for r in rows]
    moved = [r["actor/kl"] for r in rows[1:]]
    assert max(drift) < 1e-4, drift
    assert min(moved) > 100 * max(drift[1:]), (moved, drift)   # the adapters that reached vLLM were not the base
    assert all(r["actor/grad_norm"] > 0 for r in rows), [r["actor/grad_norm"] for r in rows]
    params_mb = sum(p.stat().st_size for p in vllm_tiny_model_dir.glob("*.safetensors")) / 1e6
    assert rows[0]["perf/weight_sync_mb"] == 0.0   # step 1 generates with the untrained adapter: nothing to push
    sent = [r["perf/weight_sync_mb"] for r in rows[1:]]   # then one adapter per update
    assert all(0 < mb < 0.1 * params_mb for mb in sent), (sent, params_mb)
    assert all(r["perf/weight_sync_s"] > 0 for r in rows[1:])
