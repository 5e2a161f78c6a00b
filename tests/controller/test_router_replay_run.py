"""Real GRPO runs with router replay (actor.router_replay = true) of the grpo-arith-moe-ep2-cpu recipe
(a tiny Qwen3-MoE, 4 experts, top-2, 2 Ray workers), shortened to 2 steps of 2 PPO epochs, so the
second epoch's routes can differ from the log-prob pass's: actor/router_mismatch is logged, the
run at ep = 2 equals the run at ep = 1 (both replaying), and a resume from step 1 reproduces
step 2 exactly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.moe_runs import moe_project, train_at_each_ep

pytestmark = pytest.mark.slow
OVERRIDES = ["resources.workers=2", "resources.cpus_per_worker=1", "data.batch_size=4", "rollout.n=4",
             "actor.mini_batch_size=4", "actor.micro_batch_size=8", "actor.ppo_epochs=2", "actor.router_replay=true",
             "data.val_batch_size=8", "run.total_steps=2", "run.save_every=1", "reward.workers=1", "run.seed=3"]
COMPARED = ("reward/mean", "response_length/mean", "actor/pg_loss", "actor/entropy", "actor/grad_norm",
            "actor/moe_aux_loss", "actor/router_mismatch", "actor/ppo_kl")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, arith_data, ray_cluster) -> dict[int, Path]:
    return train_at_each_ep(moe_project(tmp_path_factory.mktemp("replay_run"), arith_data), OVERRIDES)


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_replay_logs_the_mismatch_and_ep2_equals_ep1(runs):
    """Tolerance as test_expert_parallel_run: rtol 1e-4 (float32 sums in another order through Adam)."""
    ep2, ep1 = _rows(runs[2]), _rows(runs[1])
    assert len(ep2) == len(ep1) == 2
    assert all(0.0 <= row["actor/router_mismatch"] < 0.5 for row in ep2)
    assert all("timing/old_log_prob_s" in row for row in ep2)   # the pass that records the routes ran
    for a, b in zip(ep2, ep1):
        for key in COMPARED:
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (a["step"], key)


def test_a_replaying_run_resumes_exactly(runs):
    from rlctl.controller.run import resume_training

    before = _rows(runs[2])[1]
    resume_training(runs[2], step=1, address=None)
    after = _rows(runs[2])[-1]
    assert after["step"] == 2
    for key in COMPARED:
        assert after[key] == before[key], key
