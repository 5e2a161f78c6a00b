"""SPIN (spin-arith-cpu, shortened) on a tiny Qwen3-MoE with the experts split over the 2 Ray workers
(actor.expert_parallel_size = 2): the opponent, an unsplit reference, is refreshed from the split
policy every 2 steps (algorithm.ref_update_every). spin/margin, the growth of the policy's
log-likelihood gap against the opponent's, is 0 while opponent = policy (step 1 and the step
right after the refresh) and grows between: the refresh copied every expert (an opponent left
with any stale expert would show a margin at step 3)."""

from __future__ import annotations

import json

import pytest

from rlctl.config.loader import load_config
from rlctl.controller.run import start_training

pytestmark = pytest.mark.slow
OVERRIDES = ["resources.gpus_per_node=0", "resources.workers=2", "actor.expert_parallel_size=2",
             "data.max_response_length=4", "data.max_prompt_length=96", "data.val_files=[]", "reward.workers=1",
             "reward.function=arith", 'data.train_files=["data/arith/train.parquet"]', "run.total_steps=3",
             "run.save_every=2", "algorithm.ref_update_every=2", "actor.lr=3e-3", "algorithm.params.dpo_beta=0.5"]


@pytest.mark.timeout(900)
def test_spin_refreshes_an_unsplit_opponent_from_an_ep2_policy(tmp_path, arith_data, ray_cluster):
    from rlctl.models.tiny import build_tiny_model
    from rlctl.project import write_project

    build_tiny_model(tmp_path / "moe", arch="qwen3_moe")
    write_project(tmp_path, "spin-arith-cpu", str(tmp_path / "moe"))
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "arith").symlink_to(arith_data)
    start_training(load_config(tmp_path / "rlctl.toml", OVERRIDES), address=None, force=False)
    metrics = (tmp_path / "runs" / "spin-arith-cpu" / "metrics.jsonl").read_text()
    rows = [json.loads(line) for line in metrics.splitlines()]
    margin = [r["spin/margin"] for r in rows]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert abs(margin[0]) < 1e-4 and abs(margin[2]) < 1e-4, margin   # opponent = policy
    assert margin[1] > 0.05, margin                                   # inside the iteration: the gap grew
