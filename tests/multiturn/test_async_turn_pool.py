"""Partial multi-turn rollouts (rlctl.controller.async_turns.TurnPool) on a real rollout rank, no Ray:
a round is one turn of every live conversation, so a push between rounds lands between turns; each
model token is tagged with the version that sampled it and carries that version's log-prob (checked
by putting the rank back on each version's weights), tool and interaction tokens are -1; and the
pool's saved state (conversations, the calculator's and a verl-style interaction's per-instance
state) continues to exactly the rows of the run that was not interrupted."""

from __future__ import annotations

import numpy as np
import pytest

from rlctl.config.schema import Config, DataConfig, ModelConfig, MultiTurnConfig, RolloutConfig
from rlctl.errors import CheckpointError
from rlctl.runtime.batch import Batch

# verl's BaseInteraction shape: the state of each conversation lives in the object, by instance id
ASKER = '''
class Asker:
    def __init__(self, config):
        self.asked = {}

    async def start_interaction(self, instance_id=None, **kwargs):
        self.asked[instance_id] = 0
        return instance_id

    async def generate_response(self, instance_id, messages, **kwargs):
        self.asked[instance_id] += 1
        return False, f"Are you sure? ({self.asked[instance_id]})", 0.0, {}

    async def finalize_interaction(self, instance_id):
        self.asked.pop(instance_id)
'''


def _setup(model_dir, tmp_path, ranks: int = 1):
    from rlctl.controller.prompts import render_prompts
    from rlctl.controller.rollout import prompt_batch
    from rlctl.multiturn.rollout import ToolLoop
    from rlctl.rollouts.base import RolloutContext
    from rlctl.runtime.dispatch import collect_results, dispatch_mode, split_arguments
    from rlctl.workers.roles.rollout_worker import RolloutWorker

    (tmp_path / "asker.py").write_text(ASKER)
    mt = MultiTurnConfig(enable=True, tools=("calculator",), interaction="asker.py:Asker", max_turns=3)
    config = Config(model=ModelConfig(path=str(model_dir), dtype="float32"),
                    data=DataConfig(train_files=("x",), max_prompt_length=1024, max_response_length=200),
                    rollout=RolloutConfig(n=2, temperature=0.3, mode="async", partial_rollout=True, multi_turn=mt))
    worker = RolloutWorker(config)

    class Ranks:   # what the Ray group does: split each call over `ranks` ranks (here all one worker's weights)
        world_size = ranks

        def __getattr__(self, method):
            mode = dispatch_mode(RolloutWorker, method)

            def call(*args, **kwargs):
                parts = split_arguments(mode, ranks, args, kwargs, method)
                return collect_results(mode, [getattr(worker, method)(*a, **k) for a, k in parts])
            return call

    def turns():
        return ToolLoop(Ranks(), RolloutContext(config, worker.tokenizer, tmp_path, worker.eos_ids))

    rows = [{"prompt": [{"role": "user", "content": q}], "data_source": "calc", "reward_model": {"ground_truth": ""},
             "extra_info": {}} for q in ("What is 2 + 2?", "What is 2 + 2?")]
    actor = turns()
    prompts = prompt_batch(render_prompts(rows, worker.tokenizer, 1024, "error", tools=actor.runner.schemas).rows,
                           "t", actor.pad)
    return config, worker, turns, actor, prompts


def _until_empty(pool, seed: int, version: int) -> list:
    out = []
    while pool.entries:
        seed += 1
        rows = pool.round(None, seed=seed, version=version)
        if len(rows):
            out.append(rows)
    return out


def test_pushes_land_between_turns_with_per_token_versions_and_the_pool_resumes_exactly(tool_model_dir, tmp_path):
    from rlctl.controller.async_turns import TurnPool

    config, worker, turns, actor, prompts = _setup(tool_model_dir, tmp_path)
    v0 = worker.export_weights()
    rng = np.random.default_rng(0)
    v1 = {k: (v + rng.normal(scale=0.02, size=v.shape)).astype(v.dtype) for k, v in v0.items()}

    pool = TurnPool(config, actor)
    first = pool.round(prompts, seed=1, version=0)   # every conversation's first turn on v0
    assert len(first) == 0 and pool.meta() == {"pool_rows": 4, "pool_oldest": 0}
    saved, asked = pool.state_dict(), dict(actor.interaction.obj.asked)
    worker.update_weights(v1, version=1)             # the push lands between turns 1 and 2
    rows = _until_empty(pool, 1, version=1)
    assert not actor.interaction.obj.asked, "each conversation's interaction was finalised"

    batch = rows[0] if len(rows) == 1 else Batch.concat(rows)
    assert len(batch) == 4
    versions, mask, lengths = batch["token_version"], batch["response_mask"], batch["response_length"]
    real = np.arange(versions.shape[1])[None, :] < lengths[:, None]
    assert ((versions >= 0) == (mask > 0)).all() and (versions[~real] == -1).all()
    assert all(set(np.unique(v[v >= 0])) == {0, 1} for v in versions), "every conversation straddles the push"
    assert (batch["policy_version"] == 0).all()
    assert all(s["num_turns"] == 3 and s["tool_calls"] for s in batch["multi_turn"])
    assert all(any(m["role"] == "tool" and m["content"] == "4" for m in conv) for conv in batch["conversation"])
    assert all(sum(m["role"] == "user" and m["content"].startswith("Are you sure?") for m in conv) == 1
               for conv in batch["conversation"]), "the interaction answered each conversation's second turn"
    # each token's rollout_log_prob is the log-prob of the weights it is tagged with
    model = {k: batch[k] for k in ("input_ids", "attention_mask", "response_mask")}
    for version, weights in ((0, v0), (1, v1)):
        worker.update_weights(weights, version=version)
        expected = worker.tag_rollout(Batch(dict(model)))["rollout_log_prob"]
        at = versions == version
        np.testing.assert_allclose(batch["rollout_log_prob"][at], expected[at], atol=2e-5)
    other = worker.tag_rollout(Batch(dict(model)))["rollout_log_prob"]   # v1's on v0's tokens: not equal
    assert np.abs(batch["rollout_log_prob"][versions == 0] - other[versions == 0]).max() > 1e-3

    # the saved pool (conversations + the interaction's per-instance state) continues identically
    resumed = TurnPool(config, turns())
    resumed.load_state_dict(saved)
    assert resumed.turns.interaction.obj.asked == asked and len(asked) == 4
    again = _until_empty(resumed, 1, version=1)
    _assert_same_rows(again, rows)

    # state that does not pickle stops the save with one line, not a half-written checkpoint
    resumed.turns.interaction.obj.hook = lambda: None
    with pytest.raises(CheckpointError, match="does not pickle"):
        resumed.state_dict()


def _assert_same_rows(got: list, want: list) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.tensors.keys() == b.tensors.keys()
        for key in a.tensors:
            if a[key].dtype == object:
                assert list(a[key]) == list(b[key]), key
            else:
                np.testing.assert_array_equal(a[key], b[key], err_msg=key)


def test_fewer_live_conversations_than_rollout_ranks_are_tagged_and_resume_exactly(tool_model_dir, tmp_path):
    """resources.rollout_workers > 1: every round has 4 conversations live on 5 ranks, fewer than
    the data-parallel tag_rollout call splits (async_turns.fill_ranks pads it); each token still
    carries its own row's log-prob, and the saved pool continues to the same rows."""
    from rlctl.controller.async_turns import TurnPool

    config, worker, turns, actor, prompts = _setup(tool_model_dir, tmp_path, ranks=5)
    pool = TurnPool(config, actor)
    assert len(pool.round(prompts, seed=1, version=0)) == 0 and pool.meta()["pool_rows"] == 4
    saved = pool.state_dict()
    rows = _until_empty(pool, 1, version=0)
    batch = rows[0] if len(rows) == 1 else Batch.concat(rows)
    assert len(batch) == 4 and all(s["num_turns"] == 3 for s in batch["multi_turn"])
    at = batch["token_version"] == 0
    model = Batch({k: batch[k] for k in ("input_ids", "attention_mask", "response_mask")})
    np.testing.assert_allclose(batch["rollout_log_prob"][at], worker.tag_rollout(model)["rollout_log_prob"][at],
                               atol=2e-5)
    resumed = TurnPool(config, turns())
    resumed.load_state_dict(saved)
    _assert_same_rows(_until_empty(resumed, 1, version=0), rows)
