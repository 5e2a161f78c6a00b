"""A new trained role is its worker class plus one row of the role table (rlctl.workers.roles.table):
tests/support/toy_role.py's row, added to the table, is started beside the actor by `rlctl train`,
saved into each checkpoint's toy/ folder and loaded back by `rlctl resume`, through the same code
as the actor's and the critic's; the run around it is unchanged (resume reproduces it exactly)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlctl.config.loader import load_config

SMALL = ["resources.workers=2", "data.batch_size=4", "rollout.n=2", "actor.mini_batch_size=4",
         "actor.micro_batch_size=4", "data.max_response_length=8", "data.val_files=[]", "run.total_steps=4",
         "run.save_every=2", "run.keep_last=0"]


def toy_weights(step_dir: Path) -> dict[str, torch.Tensor]:
    """The toy role's saved parameters (every rank's shard file) in a checkpoint step folder."""
    files = sorted((step_dir / "toy" / "model").glob("*.safetensors"))
    assert files, f"no toy/ shards in {step_dir}"
    return {f"{file.name}:{name}": tensor for file in files for name, tensor in load_file(str(file)).items()}


@pytest.mark.slow
def test_a_toy_trained_role_added_by_one_row_is_started_checkpointed_and_resumed(tmp_path, make_project, ray_cluster,
                                                                                 monkeypatch):
    import ray

    import support.toy_role as toy_role
    from rlctl.controller.checkpointing import checked_here
    from rlctl.controller.run import start_training
    from rlctl.workers.roles import table
    from test_resume import check_resume_reproduces

    ray.cloudpickle.register_pickle_by_value(toy_role)   # the workers get the test's class by value
    monkeypatch.setattr(table, "ROLES", table.ROLES + (toy_role.TOY,))
    assert not checked_here("toy/model/shard-00000-model-00001-of-00001.safetensors")   # its ranks check it

    proj = make_project(tmp_path / "p", "grpo-arith-cpu")
    start_training(load_config(proj / "rlctl.toml", SMALL), address=None, force=False)
    run = proj / "runs" / "grpo-arith-cpu"
    steps = run / "checkpoints"
    saved = toy_weights(steps / "step_2")
    assert saved.keys() == toy_weights(steps / "step_4").keys()
    assert all(torch.equal(saved[k], v) for k, v in toy_weights(steps / "step_4").items())   # not trained by the loop

    # the resumed run starts the toy afresh (new noise), then loads step_2/toy: its step_4 holds step 2's weights
    check_resume_reproduces(run, 2, tmp_path)
    resumed = toy_weights(steps / "step_4")
    assert resumed.keys() == saved.keys()
    for name, tensor in saved.items():
        assert torch.equal(tensor, resumed[name]), name
