"""SPIN and SPPO through `rlctl train` / `rlctl resume` on CPU: real Ray actors and the tiny model.

SPIN: the opponent is refreshed every algorithm.ref_update_every steps (its margin is exactly 0
again when an iteration starts), the policy's likelihood of the reference answers over its own
generations rises, and a resume at an iteration's end reproduces the run exactly.
SPPO: the squared loss pulls each sample's log-ratio toward eta (P_hat - 1/2), so the policy's
samples win more often under the preference model (Bradley-Terry on the arith reward) than the
initial policy's: the mean reward of its samples rises.
(The longer runs from an SFT model, with held-out figures: bench/selfplay_bench.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlctl.config.loader import load_config
from rlctl.controller.run import resume_training, start_training

CPU = ["resources.gpus_per_node=0", "resources.workers=1", "data.max_response_length=4", "data.max_prompt_length=96",
       "data.val_files=[]", "model.dtype=float32", "reward.workers=1", "reward.function=arith",
       'data.train_files=["data/arith/train.parquet"]']
NONDETERMINISTIC = ("timing/", "perf/")


def rows(path: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(NONDETERMINISTIC)}
            for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_spin_iterations_raise_the_reference_answers_over_the_generations(tmp_path, make_project, ray_cluster):
    proj = make_project(tmp_path / "p", "spin-arith-cpu")
    cfg = CPU + ["run.total_steps=4", "run.save_every=2", "run.keep_last=0", "algorithm.ref_update_every=2",
                 "data.batch_size=8", "actor.mini_batch_size=8", "actor.lr=3e-3", "algorithm.dpo_beta=0.5"]
    start_training(load_config(proj / "rlctl.toml", cfg), address=None, force=False)
    run = proj / "runs" / "spin-arith-cpu"
    m = rows(run / "metrics.jsonl")
    assert [r["step"] for r in m] == [1, 2, 3, 4]
    # an iteration starts with the opponent = the policy: margin 0; inside it the policy moved away
    assert m[0]["spin/margin"] == 0.0 and abs(m[2]["spin/margin"]) < 1e-4
    assert m[1]["spin/margin"] > 0 and m[3]["spin/margin"] > 0
    gap = [r["spin/real_log_prob"] - r["spin/generated_log_prob"] for r in m]
    assert gap[3] > gap[0] + 1.0, gap   # reference answers gained on the model's own generations
    assert all(r["data/sequences"] == 8 for r in m)   # step metrics describe the generations only

    resume_training(run, step=2, address=None)   # the opponent is restored from the step-2 checkpoint
    assert rows(run / "metrics.jsonl") == m


@pytest.mark.slow
def test_sppo_raises_the_win_rate_of_the_policys_samples(tmp_path, make_project, ray_cluster):
    proj = make_project(tmp_path / "p", "sppo-arith-cpu")
    cfg = CPU + ["run.total_steps=8", "run.save_every=0", "data.batch_size=4", "rollout.n=8",
                 "actor.mini_batch_size=4", "actor.lr=3e-3", "actor.sppo_eta=10"]
    start_training(load_config(proj / "rlctl.toml", cfg), address=None, force=False)
    m = rows(proj / "runs" / "sppo-arith-cpu" / "metrics.jsonl")
    reward = [r["reward/mean"] for r in m]
    assert sum(reward[-3:]) / 3 > sum(reward[:3]) / 3 + 0.05, reward
    assert all(abs(r["sppo/log_ratio"]) < 5 for r in m)   # the square keeps each step near pi_t
