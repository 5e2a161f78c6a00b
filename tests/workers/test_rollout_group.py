"""The separate rollout group of rollout.mode = "one_step_off": real Ray actors, one actor rank and
one rollout rank (2 CPUs). The rollout rank generates with exactly the weights it was last pushed:
its log-probs of the tokens it sampled equal the actor's at the version it tags the batch with,
and differ from the actor's once the actor has trained past that version."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from worker_fixtures import PAD, needs, run_config

from rlctl.errors import UsageError
from rlctl.runtime import Batch

ray = pytest.importorskip("ray")

from rlctl.runtime.ray_env import ray_session  # noqa: E402
from rlctl.workers.roles.groups import start_workers  # noqa: E402


def _prompts(count: int = 4, width: int = 6, seed: int = 0) -> Batch:
    rng = np.random.default_rng(seed)
    ids = np.full((count, width), PAD, dtype=np.int64)
    mask = np.zeros((count, width), dtype=np.int64)
    for r in range(count):
        k = int(rng.integers(2, width + 1))
        ids[r, width - k:], mask[r, width - k:] = rng.integers(0, 256, size=k), 1
    return Batch({"input_ids": ids, "attention_mask": mask})


def _close_on_mask(a, b, mask, atol=1e-5) -> bool:
    return bool(np.allclose(a[mask > 0], b[mask > 0], atol=atol))


@pytest.mark.slow
def test_rollout_rank_generates_with_the_pushed_weights(tiny_model_dir):
    cfg = run_config(tiny_model_dir, actor={"lr": 5e-2, "micro_batch_size": 4, "grad_clip": 0.0},
                     rollout={"n": 2, "mode": "one_step_off"},
                     data={"batch_size": 4, "max_response_length": 6, "max_prompt_length": 8},
                     resources={"gpus_per_node": 0, "workers": 1, "rollout_workers": 1})
    with ray_session(num_cpus=2):
        workers = start_workers(cfg, total_steps=2, needs=needs())
        actor, rollout = workers.actor, workers.rollout
        assert rollout is not None and rollout.world_size == 1
        assert rollout.update_weights(actor.export_weights(), version=0) == [0]

        first = rollout.generate(_prompts(), seed=1)
        assert len(first) == 8 and (first["policy_version"] == 0).all()
        mask = first["response_mask"]
        assert _close_on_mask(actor.compute_log_prob(first)["old_log_prob"], first["rollout_log_prob"], mask)

        # one actor update: the actor moves away from the rollout rank's copy ...
        train = Batch(dict(first.tensors), {"mini_batches": 1})
        train["advantages"] = np.where(mask > 0, np.random.default_rng(0).normal(size=mask.shape), 0.0).astype(np.float32)
        actor.update_actor(train)
        moved = actor.compute_log_prob(first)["old_log_prob"]
        assert not _close_on_mask(moved, first["rollout_log_prob"], mask, atol=1e-3)
        again = rollout.generate(_prompts(), seed=1)   # not pushed yet: the same tokens, version 0
        assert (again["policy_version"] == 0).all() and np.array_equal(again["responses"], first["responses"])

        # ... until its weights are pushed: then the rollout rank generates with version 1
        assert rollout.update_weights(actor.export_weights(), version=1) == [1]
        second = rollout.generate(_prompts(), seed=2)
        assert (second["policy_version"] == 1).all()
        assert _close_on_mask(actor.compute_log_prob(second)["old_log_prob"], second["rollout_log_prob"],
                              second["response_mask"])
        workers.shutdown()


def test_own_weights_engine_loads_every_pushed_tensor_and_refuses_a_bad_push(tiny_model_dir):
    """The hf engine with its own copy loads the actor's stream (numpy, HF names, tied embeddings
    once); a name the model lacks or a push that leaves a parameter unset is a one-line error."""
    from transformers import AutoModelForCausalLM

    from rlctl.workers.rollout.hf import HFRolloutEngine
    from rlctl.workers.rollout.weights import engine_weights

    source = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), torch_dtype=torch.float32)
    with torch.no_grad():
        for p in source.parameters():
            p.add_(0.01)
    stream = {name: t.numpy() for name, t in engine_weights(source)}
    assert "lm_head.weight" not in stream   # the tiny model ties its embeddings
    copy = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), torch_dtype=torch.float32)
    engine = HFRolloutEngine(copy, pad_token_id=PAD, eos_token_ids=[0], own_weights=True)
    assert engine.owns_weights
    engine.update_weights(stream)
    for (name, a), (_, b) in zip(source.state_dict().items(), copy.state_dict().items()):
        assert torch.equal(a, b), name
    with pytest.raises(UsageError, match="not a parameter of the rollout model"):
        engine.update_weights({**stream, "model.bogus.weight": np.zeros(1, dtype=np.float32)})
    with pytest.raises(UsageError, match="left 1 rollout parameter"):
        engine.update_weights({k: v for k, v in stream.items() if k != "model.norm.weight"})


def test_own_weights_engine_of_an_untied_model_needs_its_lm_head(tiny_untied_model_dir):
    """Untied embeddings: lm_head.weight is a parameter of its own; the stream carries it and a
    push without it leaves that parameter unset."""
    from transformers import AutoModelForCausalLM

    from rlctl.workers.rollout.hf import HFRolloutEngine
    from rlctl.workers.rollout.weights import engine_weights

    source = AutoModelForCausalLM.from_pretrained(str(tiny_untied_model_dir), torch_dtype=torch.float32)
    with torch.no_grad():
        source.lm_head.weight.add_(0.01)
    stream = {name: t.numpy() for name, t in engine_weights(source)}
    assert "lm_head.weight" in stream
    copy = AutoModelForCausalLM.from_pretrained(str(tiny_untied_model_dir), torch_dtype=torch.float32)
    engine = HFRolloutEngine(copy, pad_token_id=PAD, eos_token_ids=[0], own_weights=True)
    engine.update_weights(stream)
    assert torch.equal(copy.lm_head.weight, source.lm_head.weight)
    with pytest.raises(UsageError, match="left 1 rollout parameter.*lm_head.weight"):
        engine.update_weights({k: v for k, v in stream.items() if k != "lm_head.weight"})
