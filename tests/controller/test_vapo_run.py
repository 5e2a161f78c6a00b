"""VAPO through the loop: value pretraining trains the critic alone and leaves the actor's weights
bit-identical; afterwards the actor trains with the vapo loss, which reads the batch's acc column."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from rlctl.config.loader import load_config


@pytest.mark.slow
def test_value_pretraining_leaves_the_actor_bit_identical(tmp_path, make_project, ray_cluster, tiny_model_dir):
    from rlctl.checkpoint.merge import export_hf
    from rlctl.controller.run import start_training

    proj = make_project(tmp_path / "p", "vapo-arith-cpu")
    overrides = ["resources.workers=1", "data.batch_size=4", "rollout.n=2", "actor.mini_batch_size=4",
                 "actor.micro_batch_size=8", "critic.mini_batch_size=4", "critic.micro_batch_size=8",
                 "data.val_files=[]", "run.total_steps=3", "critic.pretrain_steps=2", "run.save_every=1",
                 "run.keep_last=0"]
    start_training(load_config(proj / "rlctl.toml", overrides), address=None, force=False)
    run = proj / "runs" / "vapo-arith-cpu"
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert all("critic/vf_loss" in r for r in rows)
    assert [("actor/pg_loss" in r) for r in rows] == [False, False, True]
    assert "actor/nll_loss" in rows[2] and 0 <= rows[2]["actor/nll_positive_frac"] <= 1
    start = load_file(str(tiny_model_dir / "model.safetensors"))
    after_warmup = load_file(str(export_hf(run, tmp_path / "step2", step=2) / "model.safetensors"))
    after_update = load_file(str(export_hf(run, tmp_path / "step3", step=3) / "model.safetensors"))
    shared = sorted(set(start) & set(after_warmup))
    assert shared and all(torch.equal(start[k], after_warmup[k]) for k in shared)
    assert any(not torch.equal(start[k], after_update[k]) for k in shared)   # the actor moved at step 3


def test_validate_refuses_pretraining_without_a_critic():
    import dataclasses

    from rlctl.config.checks import CheckContext
    from rlctl.config.schema import Config
    from rlctl.validate.training import check_critic_pretrain

    def problems(name, steps, total=0):
        c = Config()
        c = dataclasses.replace(c, algorithm=dataclasses.replace(c.algorithm, name=name),
                                critic=dataclasses.replace(c.critic, pretrain_steps=steps),
                                run=dataclasses.replace(c.run, total_steps=total))
        return [(p.key, p.severity) for p in check_critic_pretrain(c, CheckContext(base_dir=None, raw={}))]

    assert problems("grpo", 3) == [("critic.pretrain_steps", "error")]
    assert problems("vapo", 3) == [] and problems("gae", 3, total=10) == [] and problems("grpo", 0) == []
    assert problems("vapo", 10, total=10) == [("critic.pretrain_steps", "warning")]
