"""Partial rollouts on two async rollout ranks (rlctl.workers.rollout.partial), real Ray actors: a
sample cut by a weight push keeps its tokens and continues on the new weights, every token carries
the version that sampled it, and its rollout_log_prob is that version's log-prob of it (checked
against the actor at v1 and the rollout rank put back on v0); each rank's pool a checkpoint saves
continues to the same tokens."""

from __future__ import annotations

import numpy as np
import pytest
from worker_fixtures import PAD, needs, run_config

from rlctl.controller.async_rollout import merge_rounds
from rlctl.runtime import Batch
from rlctl.runtime.batch import object_array

ray = pytest.importorskip("ray")

from rlctl.runtime.ray_env import ray_session  # noqa: E402
from rlctl.workers.roles.groups import start_workers  # noqa: E402

pytestmark = pytest.mark.slow   # starts Ray, trains a run or starts a subprocess


def _prompts(count: int = 3, width: int = 6) -> Batch:
    rng = np.random.default_rng(0)
    ids = np.full((count, width), PAD, dtype=np.int64)
    mask = np.zeros((count, width), dtype=np.int64)
    for r in range(count):
        k = int(rng.integers(2, width + 1))
        ids[r, width - k:], mask[r, width - k:] = rng.integers(0, 256, size=k), 1
    return Batch({"input_ids": ids, "attention_mask": mask, "uid": object_array([f"p{r}" for r in range(count)])})


def _round(rollout, prompts: Batch | None, seed: int) -> Batch:
    """One round over both rollout ranks, merged as the async source merges it."""
    return merge_rounds(rollout.generate_round(prompts, seed=seed), PAD)


def _rounds(rollout, first: Batch, seed: int) -> list[Batch]:
    """Rounds without new prompts until every rank's pool is empty."""
    out = [first]
    while out[-1].meta["pool_rows"]:
        seed += 1
        out.append(_round(rollout, None, seed))
    return [b for b in out if len(b)]


def test_a_sample_cut_by_a_push_continues_on_the_new_weights_with_per_token_versions(tiny_model_dir):
    cfg = run_config(tiny_model_dir, actor={"lr": 5e-2, "micro_batch_size": 4, "grad_clip": 0.0},
                     rollout={"n": 2, "mode": "async", "partial_rollout": True, "partial_chunk": 3},
                     data={"batch_size": 3, "max_response_length": 8, "max_prompt_length": 8},
                     resources={"gpus_per_node": 0, "workers": 1, "rollout_workers": 2})
    with ray_session(num_cpus=3):   # one actor rank and two rollout ranks, one CPU each
        workers = start_workers(cfg, total_steps=2, needs=needs())
        actor, rollout = workers.actor, workers.rollout
        v0 = actor.export_weights()
        rollout.update_weights(v0, version=0)
        whole = rollout.generate(_prompts(), seed=5)   # the non-partial call: same columns expected
        first = _round(rollout, _prompts(), seed=1)   # round 1 on v0: 3 tokens each at most, prompts split 2 / 1
        assert first.meta["pool_rows"] > 0

        train = Batch(dict(whole.tensors), {"mini_batches": 1})
        mask = whole["response_mask"]
        train["advantages"] = np.where(mask > 0, np.random.default_rng(0).normal(size=mask.shape), 0.0).astype(np.float32)
        actor.update_actor(train)
        v1 = actor.export_weights()
        rollout.update_weights(v1, version=1)
        saved = rollout.export_pool()   # what an async checkpoint holds of the unfinished samples, per rank
        assert len(saved) == 2 and all(state["samples"] for state in saved)   # both ranks hold some
        done = Batch.concat(_rounds(rollout, first, seed=1))
        rollout.load_pool(saved)        # resume: the same rounds continue them to the same tokens
        again = Batch.concat(_rounds(rollout, first, seed=1))
        assert all(np.array_equal(done[k], again[k]) for k in ("responses", "token_version", "rollout_log_prob"))

        assert sorted(done["uid"].tolist()) == ["p0", "p0", "p1", "p1", "p2", "p2"]
        assert set(done.keys()) == set(whole.keys()) | {"token_version"}
        assert done["responses"].shape == whole["responses"].shape
        versions, mask = done["token_version"], done["response_mask"] > 0
        assert ((versions >= 0) == mask).all()
        spans = [(set(v[m].tolist()) == {0, 1}) for v, m in zip(versions, mask)]
        assert any(spans), versions   # some sample's tokens come from both versions
        assert (done["policy_version"] == np.where(mask, versions, 9).min(axis=1)).all()   # the oldest token's

        at_v1 = actor.compute_log_prob(done)["old_log_prob"]
        rollout.update_weights(v0, version=0)
        at_v0 = rollout.tag_rollout(done)["rollout_log_prob"]
        got = done["rollout_log_prob"]
        assert np.allclose(got[versions == 1], at_v1[versions == 1], atol=1e-4)
        assert np.allclose(got[versions == 0], at_v0[versions == 0], atol=1e-4)
        assert not np.allclose(at_v0[versions == 1], at_v1[versions == 1], atol=1e-3)   # the versions differ
        workers.shutdown()
