"""rollout.mode = "one_step_off" (and "async") with the experts split over the actor's 2 workers
(actor.expert_parallel_size = 2): the separate rollout rank generates with a whole copy of the
policy, and after every update the actor exports its weights to it with each expert bank gathered
from the split ranks; the run resumes exactly.

Real everything: the grpo-arith-moe-ep2-cpu recipe, shortened, 2 actor workers and 1 rollout
worker as Ray actors, the hf engine. The run's metrics equal those of the same run at ep = 1 (an
export that lost or misplaced an expert would give the rollout copy another model, and step 3 other
samples); the resumed run's metrics and final weights equal the uninterrupted run's bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.moe_runs import moe_project, train_at_each_ep
from test_one_step_off import deterministic
from test_resume import final_weights

from rlctl.config.loader import load_config
from rlctl.controller.run import resume_training, start_training

pytestmark = pytest.mark.slow
STEPS = 3
OVERRIDES = ["resources.workers=2", "resources.cpus_per_worker=1", "resources.rollout_workers=1",
             "rollout.mode=one_step_off", "data.batch_size=4", "rollout.n=4", "actor.mini_batch_size=4",
             "actor.micro_batch_size=8", "data.val_files=[]", f"run.total_steps={STEPS}", "run.save_every=1",
             "run.keep_last=0", "reward.workers=1", "run.seed=3"]


@pytest.fixture(scope="module")
def three_cpus():
    """Embedded Ray with 3 CPUs: 2 actor ranks (one expert group) and 1 rollout rank. On a 2-core
    machine the 3 one-thread workers share the cores, so the start-up check that the groups fit the
    machine's cores is told of 3 (the one thing mocked: the cores)."""
    from rlctl.runtime import ray_env

    with pytest.MonkeyPatch.context() as patch:
        cores = ray_env.machine_cpus()
        patch.setattr(ray_env, "machine_cpus", lambda: max(3, cores))
        with ray_env.ray_session(num_cpus=3, log_to_driver=False):
            yield


@pytest.fixture(scope="module")
def runs(tmp_path_factory, arith_data, three_cpus) -> dict[int, Path]:
    return train_at_each_ep(moe_project(tmp_path_factory.mktemp("ep_offpolicy_run"), arith_data), OVERRIDES)


def test_one_step_off_at_ep2_equals_ep1(runs):
    """Step 3 trains on a batch generated with the weights the actor exported after update 1: at ep = 2
    each bank gathered from the split ranks. Tolerance as test_expert_parallel_run.py: rtol 1e-4."""
    ep2, ep1 = deterministic(runs[2]), deterministic(runs[1])
    assert [r["step"] for r in ep2] == [r["step"] for r in ep1] == list(range(1, STEPS + 1))
    assert [r["rollout/policy_version"] for r in ep2] == [0.0, 0.0, 1.0]   # one step off
    for a, b in zip(ep2, ep1):
        for key in ("reward/mean", "response_length/mean", "rollout/logprob_diff_mean", "actor/pg_loss",
                    "actor/entropy", "actor/grad_norm", "actor/moe_aux_loss"):
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-6), (a["step"], key)


def test_a_resumed_run_repeats_the_uninterrupted_one(runs, tmp_path):
    assert_resume_repeats(runs[2], 2, tmp_path)


def assert_resume_repeats(run: Path, step: int, tmp_path: Path) -> None:
    """`rlctl resume` from `step`'s checkpoint gives the run's metrics and final weights bit for bit."""
    full_rows, full_weights = deterministic(run), final_weights(run, tmp_path)
    resume_training(run, step=step, address=None)
    assert deterministic(run) == full_rows
    resumed = final_weights(run, tmp_path)
    assert resumed.keys() == full_weights.keys()
    for name, tensor in full_weights.items():
        assert torch.equal(tensor, resumed[name]), name


def test_async_with_staleness_1_at_ep2_equals_one_step_off(runs, tmp_path):
    """rollout.mode = "async" pushes through the same export: with max_staleness = 1 its schedule is
    one_step_off's (test_async.py), so at ep = 2 the two runs are equal bit for bit."""
    from test_async import rows

    proj = runs[2].parents[1]
    start_training(load_config(proj / "rlctl.toml", OVERRIDES + [
        "actor.expert_parallel_size=2", "run.name=async", "rollout.mode=async", "rollout.max_staleness=1",
        "rollout.sync_every=1", "rollout.staleness_strategy=wait"]), address=None, force=False)
    run = proj / "runs" / "async"
    assert [r["async/staleness_max"] for r in rows(run)] == [0.0, 1.0, 1.0]
    assert rows(run, ("async/",)) == rows(runs[2])
    a, b = final_weights(runs[2], tmp_path), final_weights(run, tmp_path)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
