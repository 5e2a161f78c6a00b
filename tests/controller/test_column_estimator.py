"""A new estimator or policy loss that reads existing batch columns is one file: it names the columns
(`reads=`), and the run starts the passes that fill them (rlctl.algorithms.COLUMNS), the controller
hands them over, validate and the actor's update follow, with no line of rlctl naming it. Here the
estimator reads the old and the reference log-probs, so a run with no KL term at all still loads the
reference model, and the policy loss reads sum_pi_squared, which the estimator does not: the run's
needs (computed once, from both) reach the actor, whose log-prob pass then returns it."""

from __future__ import annotations

import json
import uuid

import numpy as np
import pytest

from rlctl import algorithms
from rlctl.algorithms import FixedKLController
from rlctl.config.loader import load_config
from rlctl.controller.advantage import compute_advantages
from rlctl.runtime.batch import Batch
from rlctl.validate import validate
from rlctl.workers.roles.table import ROLES, RunRoles

ESTIMATOR = '''
from dataclasses import dataclass

import torch

from rlctl.algorithms import register_estimator


@dataclass(frozen=True)
class AnchorParams:
    beta: float = 0.1   # weight of the row's summed log-ratio to the reference


@register_estimator("anchored_{tag}", needs_group=True, reads=("old_log_prob", "ref_log_prob"), params=AnchorParams)
def anchored(*, token_level_rewards, response_mask, group_ids, old_log_prob, ref_log_prob, beta, **_):
    """A_i = R'_i - mean_g R', R'_i = R_i - beta sum_t (log pi_old - log pi_ref), on every token."""
    scores = token_level_rewards.sum(-1) - beta * ((old_log_prob - ref_log_prob) * response_mask).sum(-1)
    index = {{g: i for i, g in enumerate(dict.fromkeys(group_ids))}}
    rows = torch.tensor([index[g] for g in group_ids])
    means = torch.zeros(len(index), dtype=scores.dtype).index_add(0, rows, scores) / torch.bincount(rows)
    adv = (scores - means[rows]).unsqueeze(-1) * response_mask
    return adv, adv
'''

POLICY_LOSS = '''
from rlctl.algorithms import aggregate_loss, register_policy_loss


@register_policy_loss("peaked_{tag}", reads=("sum_pi_squared",))
def peaked(*, log_prob, advantages, response_mask, sum_pi_squared, loss_agg_mode, norm, **_):
    """REINFORCE with each token weighted by how peaked the sampling policy was there:
    sum_v pi_old(v)^2, in (0, 1] (1: all mass on one token)."""
    loss = aggregate_loss(-advantages * sum_pi_squared * log_prob, response_mask, loss_agg_mode, norm=norm)
    peak = (sum_pi_squared * response_mask).sum() / response_mask.sum().clamp(min=1)
    return loss, {{"peak": float(peak)}}
'''

NO_KL = ["algorithm.kl_in_reward=false", "actor.use_kl_loss=false"]


def chosen(tag: str) -> list[str]:
    """The overrides that pick the plugins: the files that register them, by name."""
    return ['algorithm.plugins=["anchored.py", "peaked.py"]', f"algorithm.name=anchored_{tag}",
            f"actor.policy_loss=peaked_{tag}", *NO_KL]


def write_plugins(folder, tag: str) -> None:
    """The estimator's and the policy loss's files, registering names of this tag."""
    (folder / "anchored.py").write_text(ESTIMATOR.format(tag=tag))
    (folder / "peaked.py").write_text(POLICY_LOSS.format(tag=tag))


@pytest.fixture
def project(tmp_path):
    tag = uuid.uuid4().hex[:8]   # registries are per process: every test registers its own name
    write_plugins(tmp_path, tag)
    (tmp_path / "rlctl.toml").write_text('[model]\npath = "model"\n[data]\ntrain_files = ["train.parquet"]\n')
    return tmp_path, tag


def test_its_columns_decide_what_the_run_starts_and_reach_it_through_the_controller(project):
    proj, tag = project
    loaded = load_config(proj / "rlctl.toml", [*chosen(tag), "algorithm.params.beta=1.0", "rollout.n=2"],
                         strict=False)
    problems, _ = validate(loaded, machine=False)   # imports the plugin, as `rlctl train` does
    assert [p for p in problems if p.key.startswith(("algorithm", "actor", "critic"))] == []
    needs = algorithms.run_needs(loaded.config)
    assert needs.reference and needs.old_log_prob and needs.min_group_size == 2   # without any KL term
    assert needs.sum_pi_squared and not algorithms.algorithm_needs(f"anchored_{tag}").sum_pi_squared   # the loss's
    assert not (needs.critic or needs.greedy_baseline or needs.implicit_prm)
    [actor] = [role for role in ROLES if role.name == "actor"]   # the actor is handed them, not left to guess
    assert actor.instances(RunRoles(loaded.config, 1, needs))["actor"]["needs"] == needs
    assert {"old_log_prob", "ref_log_prob"} <= set(algorithms.update_columns())   # the actor's update gets them

    mask = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=np.int64)
    old = np.where(mask > 0, -1.0, 7.0).astype(np.float32)              # junk on padding: it must not count
    ref = np.where(mask > 0, -1.0, -50.0).astype(np.float32)
    ref[0, :2] = -1.25                                                  # row 0: log-ratio 0.25 on 2 tokens
    batch = Batch({"scores": np.array([1.0, 0.0, 1.0, 0.0], dtype=np.float32), "response_mask": mask,
                   "response_length": mask.sum(1), "uid": np.array(["a", "a", "b", "b"], dtype=object),
                   "old_log_prob": old, "ref_log_prob": ref})
    compute_advantages(batch, loaded.config, FixedKLController(0.0))
    # R' = [1 - 0.5, 0, 1, 0]: group a [0.25, -0.25], group b [0.5, -0.5] on each row's tokens
    np.testing.assert_allclose(batch["advantages"], np.array([0.25, -0.25, 0.5, -0.5])[:, None] * mask)
    del batch.tensors["ref_log_prob"]
    with pytest.raises(algorithms.AlgorithmError, match="needs ref_log_prob"):
        compute_advantages(batch, loaded.config, FixedKLController(0.0))


@pytest.mark.slow
def test_a_run_starts_the_passes_its_estimator_and_loss_read(tmp_path, make_project, ray_cluster):
    from support.dense_reward import DENSE_REWARD, ONE_DENSE_STEP
    from rlctl.controller.run import start_training

    tag = uuid.uuid4().hex[:8]
    proj = make_project(tmp_path, "grpo-gsm8k")
    write_plugins(proj, tag)
    (proj / "dense.py").write_text(DENSE_REWARD)
    overrides = [*ONE_DENSE_STEP, *chosen(tag), "algorithm.params.beta=0.5"]
    start_training(load_config(proj / "rlctl.toml", overrides), address=None, force=False)
    [row] = [json.loads(line) for line in (proj / "runs" / "grpo-gsm8k" / "metrics.jsonl").read_text().splitlines()]
    assert "timing/ref_s" in row and "timing/old_log_prob_s" in row   # the passes its columns name ran,
    assert "actor/reward_kl" not in row and "actor/kl_loss" not in row   # with no KL term asking for them
    assert row["critic/advantages/max"] > 0 > row["critic/advantages/min"]   # centred within each prompt
    assert 0 < row["actor/peak"] <= 1   # the loss got sum_pi_squared from the old_log_prob pass
