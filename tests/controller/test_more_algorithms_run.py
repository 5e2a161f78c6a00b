"""The newer losses and estimators through a real `rlctl train` (Ray actors, the HF engine, the
reward pool): what they declare they need reaches them, and their metrics are logged.

Per-algorithm learning is proven in-process on a toy task (tests/algorithms/test_group_estimators.py, test_policy_loss_variants.py);
these runs prove the wiring, and that the reward still rises on the tiny model's dense task.
Self-play (SPIN, SPPO; math in tests/algorithms/test_selfplay.py): SPIN's opponent is refreshed every
algorithm.ref_update_every steps, its likelihood margin of the reference answers over the generations
grows inside an iteration, and a resume at an iteration's end is exact; SPPO's samples win more often
under its preference model (Bradley-Terry on the reward) as it trains. Longer runs from an SFT model,
with held-out figures: bench/selfplay_bench.py.
"""

from __future__ import annotations

import json

import pytest

from rlctl.config.loader import load_config
from rlctl.controller.run import resume_training, start_training
from support.dense_reward import DENSE_REWARD

# share of lowercase letters (about 10% for the random tiny model), split into two components
DENSE_PARTS = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    text = solution_str
    lower = sum("a" <= ch <= "z" for ch in text) / max(len(text), 1)
    short = float(len(text) < 12)
    return {"score": lower, "lower": lower, "short": short}
'''

COMMON = ["resources.gpus_per_node=0", "resources.workers=1", "data.max_response_length=8",
          "data.max_prompt_length=96", "data.val_files=[]", 'data.train_files=["data/arith/train.parquet"]',
          "model.dtype=float32", "model.gradient_checkpointing=false", "run.save_every=0",
          "reward.function=dense.py:compute_score", "reward.workers=1", "actor.lr=3e-3", "actor.warmup_steps=0",
          "data.batch_size=8", "rollout.n=8", "actor.mini_batch_size=8", "actor.micro_batch_size=64"]


def train(make_project, tmp_path, overrides, steps):
    proj = make_project(tmp_path, "grpo-gsm8k")
    (proj / "dense.py").write_text(DENSE_PARTS)
    start_training(load_config(proj / "rlctl.toml", COMMON + overrides + [f"run.total_steps={steps}"]),
                   address=None, force=False)
    run = proj / "runs" / "grpo-gsm8k"
    assert json.loads((run / "run.json").read_text())["status"] == "finished"
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_gdpo_with_reward_components_and_sapo_learns(tmp_path, make_project, ray_cluster):
    rows = train(make_project, tmp_path, ["algorithm.name=gdpo", 'algorithm.params.reward_keys=["lower", "short"]',
                                          "algorithm.params.reward_weights=[1.0, 0.1]", "actor.policy_loss=sapo",
                                          "actor.use_kl_loss=true", 'actor.kl_loss_type="low_var_kl+"'], 16)
    rewards = [r["reward/mean"] for r in rows]
    first, last = sum(rewards[:4]) / 4, sum(rewards[-4:]) / 4
    assert last > first + 0.05, f"gdpo+sapo: reward {first:.3f} -> {last:.3f}"
    assert all(r["reward/lower"] >= 0 for r in rows) and all("actor/kl_loss" in r for r in rows)


@pytest.mark.slow
def test_optimal_token_baseline_with_rollout_correction(tmp_path, make_project, ray_cluster):
    rc = "algorithm.rollout_correction."
    rows = train(make_project, tmp_path, ["algorithm.name=optimal_token_baseline", "actor.policy_loss=dppo_tv",
                                          f'{rc}rollout_is="token"', f'{rc}rollout_rs="token_k1,seq_max_k3"',
                                          f'{rc}rollout_rs_threshold="0.5_2.0,0.01"'], 3)
    # old_log_prob was recomputed (the estimator reads it, and rollout correction) although this is one
    # on-policy update; sum_pi_squared reached the estimator (it raises without it)
    assert all("timing/old_log_prob_s" in r for r in rows), rows[0].keys()
    assert all(abs(r["critic/advantages/mean"]) < 10 for r in rows)
    # the hf engine samples with the trained weights: rollout log-probs = old log-probs, weights 1
    for r in rows:
        assert r["rollout_corr/rollout_is_mean"] == 1.0 and r["rollout_corr/rollout_is_max"] == 1.0
        assert r["rollout_corr/rollout_is_ratio_fraction_high"] == 0.0
        assert r["rollout_corr/rollout_rs_masked_fraction"] == 0.0 and r["rollout_corr/kl"] == 0.0


SELFPLAY_CPU = ["resources.gpus_per_node=0", "resources.workers=1", "data.max_response_length=4",
                "data.max_prompt_length=96", "data.val_files=[]", "model.dtype=float32", "reward.workers=1",
                "reward.function=arith", 'data.train_files=["data/arith/train.parquet"]']
NONDETERMINISTIC = ("timing/", "perf/")


def rows(path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if not k.startswith(NONDETERMINISTIC)}
            for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_spin_iterations_raise_the_reference_answers_over_the_generations(tmp_path, make_project, ray_cluster):
    proj = make_project(tmp_path / "p", "spin-arith-cpu")
    cfg = SELFPLAY_CPU + ["run.total_steps=4", "run.save_every=3", "run.keep_last=0", "algorithm.ref_update_every=3",
                          "data.batch_size=8", "actor.mini_batch_size=8", "actor.lr=3e-3", "algorithm.params.dpo_beta=0.5"]
    start_training(load_config(proj / "rlctl.toml", cfg), address=None, force=False)
    run = proj / "runs" / "spin-arith-cpu"
    m = rows(run / "metrics.jsonl")
    assert [r["step"] for r in m] == [1, 2, 3, 4]
    # spin/margin: on the step's own pairs, how much the policy's log-likelihood gap of reference answer
    # over generation grew against the opponent's. An iteration starts with opponent = policy (0); inside
    # it the gap grows step by step; the refresh before step 4 makes the opponent the policy again.
    margin = [r["spin/margin"] for r in m]
    assert margin[0] == 0.0 and abs(margin[3]) < 1e-4, margin
    assert 0.5 < margin[1] < margin[2], margin
    assert all(r["data/sequences"] == 8 for r in m)   # step metrics describe the generations only

    resume_training(run, step=3, address=None)   # the opponent of step 4 is the step-3 checkpoint
    assert rows(run / "metrics.jsonl") == m


@pytest.mark.slow
def test_sppo_raises_the_win_rate_of_the_policys_samples(tmp_path, make_project, ray_cluster):
    """The dense toy reward (share of lowercase letters) gives every group a preference signal from step 1."""
    proj = make_project(tmp_path / "p", "sppo-arith-cpu")
    (proj / "dense.py").write_text(DENSE_REWARD)
    steps = 12
    cfg = SELFPLAY_CPU + [f"run.total_steps={steps}", "run.save_every=0", "data.batch_size=8", "rollout.n=8",
                          "actor.mini_batch_size=8", "actor.micro_batch_size=64", "actor.lr=3e-3",
                          "actor.loss_params.sppo_eta=10", "data.max_response_length=8", "reward.function=dense.py:compute_score",
                          "actor.use_kl_loss=false"]   # the loss alone: no reference worker to start
    start_training(load_config(proj / "rlctl.toml", cfg), address=None, force=False)
    m = rows(proj / "runs" / "sppo-arith-cpu" / "metrics.jsonl")
    reward = [r["reward/mean"] for r in m]
    # the win rate of a late sample over an early one under the Bradley-Terry preference: above 1/2
    early, late = sum(reward[:3]) / 3, sum(reward[-3:]) / 3
    assert late > early + 0.05, reward
    assert all(abs(r["actor/sppo/log_ratio"]) < 5 for r in m)   # the square keeps each step near pi_t
