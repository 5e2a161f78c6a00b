"""One-step off-policy training (rollout.mode = "one_step_off"): generation overlaps training.

A separate rollout group (rlctl.workers.roles.rollout_worker) owns a copy of the policy. While the actor
trains on batch k, that group generates batch k+1 with the weights it holds, those of update k-1:

    rollout group:  gen 1 (v0) | gen 2 (v0)        | load v1 | gen 3 (v1)        | load v2 | ...
    actor group:               | train 1 -> v1     |          train 2 -> v2     |
                               ^ push v1 (queued behind gen 2)  ^ push v2

Each rank runs its calls in submission order, so a push queued behind generation k+1 is loaded
right after it and generation k+2 sees it: batch k is always one update stale (k >= 2). Batches
carry `policy_version` [B] (the update count of the weights that generated them) and
`rollout_log_prob` (those weights' log-probs); the trainer recomputes old_log_prob, and rollout
correction (verl's sequence-level TIS by default, algorithm.rollout_correction.rollout_is =
"auto") reweights the stale samples. Weights travel as numpy arrays through the object store.

Resume is exact: a checkpoint after step k also holds batch k+1, already generated with v_{k-1}
(the save waits for it), in `pending_rollout.pkl`; resume trains on it instead of regenerating
it with v_k, and pushes v_k to the fresh rollout group before generating batch k+2.

A rollout kind that drives the group turn by turn (its row's `one_call` is False: rlctl.rollouts.table;
the tool loop) runs over the rollout group from a thread of this process, built as the actor's is
(`rollout_over`) with its own tools and interaction, one `generate_turn` call per turn, then tags
the batch (`tag_rollout`). A weight push waits for the batch in flight to finish its turns, so every
turn of a sample comes from the same weights and the staleness is the single-turn one.
"""

from __future__ import annotations

import pickle
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rlctl.controller import rollout
from rlctl.controller.timing import phase
from rlctl.rollouts.table import kind_of
from rlctl.runtime.batch import Batch

if TYPE_CHECKING:
    from rlctl.controller.setup import TrainSetup
    from rlctl.runtime.worker_group import RoleHandle
    from rlctl.workers.roles.groups import Workers

PENDING_FILE = "pending_rollout.pkl"


class OneStepOff:
    """The rollout source of one_step_off mode (rlctl.controller.rollout_source.RolloutSource):
    `next(step)` returns the batch generated one update ago, `after_update(version)` pushes the
    new weights to the rollout group."""

    on_policy = False   # batch k comes from the weights of update k-2: drift is by design

    def __init__(self, setup: TrainSetup, workers: Workers):
        self.setup = setup
        self.group: RoleHandle = workers.rollout
        self.pending: tuple[int, object] | None = None   # (step, PendingCall, Future or Batch) being generated
        self.push = None                                  # the last weight push (PendingCall)
        self.restored: dict | None = None                 # the batch a checkpoint saved in flight
        self.turns = None                                 # a turn-by-turn rollout over the rollout group

    def start(self, first_step: int) -> None:
        """Give the rollout group the actor's current weights (update first_step - 1) and take back
        a batch a checkpoint saved in flight."""
        if not kind_of(self.setup.config).one_call:
            self.turns = rollout_over(self.setup, self.group)
        self.push_weights(first_step - 1)
        saved, self.restored = self.restored, None
        if saved is not None and saved["step"] == first_step:
            self.pending = (first_step, Batch(saved["tensors"], saved["meta"]))

    def push_weights(self, version: int) -> dict:
        """The actor's trained weights (after `version` updates) to every rollout rank, no disk:
        rank 0 of the actor returns numpy arrays, put once in the object store for all ranks
        (the worker group puts a dict argument of an ALL call there). next() waits for it (a
        failed push surfaces there) before the next push. A turn-by-turn batch in flight finishes its
        turns first: the group runs each call in order, and new weights must not land between turns.
        Returns what was pushed (the adapter alone with model.lora.sync = "adapter")."""
        if self.turns is not None and self.pending is not None:
            self._wait()
        weights = self.setup.actor.export_weights()
        self.push = self.group.submit("update_weights", weights, version=version)
        return weights

    def after_update(self, step: int) -> dict:
        timing: dict = {}
        if step < self.setup.total_steps:   # the last update has no next batch to generate
            with phase(timing, "sync_weights"):
                weights = self.push_weights(step)
            timing.update(rollout.push_metrics(timing, weights))
        return timing

    def next(self, step: int) -> tuple[Batch, dict]:
        """Batch `step` (generated one update ago, or now when nothing is in flight), scored; batch
        step+1 is submitted before scoring, so it generates while this one is scored and trained."""
        setup = self.setup
        if self.pending is None or self.pending[0] != step:
            self._submit(step)
        start = time.perf_counter()
        _, batch = self._wait()
        self.pending = None
        waited = time.perf_counter() - start
        self.push.result()
        if step < setup.total_steps:
            self._submit(step + 1)
        start = time.perf_counter()
        metrics = rollout.score(setup, batch, rollout.reward_component_keys(setup.config))
        versions = batch["policy_version"]
        metrics.update({"timing/reward_s": time.perf_counter() - start, "timing/gen_wait_s": waited,
                        "rollout/policy_version": float(versions.min()),
                        "rollout/staleness": float((step - 1) - versions.min()), **rollout.engine_copy_drift([batch])})
        return batch, metrics

    def _submit(self, step: int) -> None:
        setup = self.setup
        prompts = rollout.prompt_batch(setup.loader.next_batch(), f"{step}.1", setup.pad_token_id)
        if self.turns is not None:
            self.pending = (step, _in_thread(self._generate_turns, prompts, setup.seed_for(step, 1)))
        else:
            self.pending = (step, self.group.submit("generate", prompts, seed=setup.seed_for(step, 1)))

    def _generate_turns(self, prompts: Batch, seed: int) -> Batch:
        """A turn-by-turn batch from the rollout group, tagged with its weights' version and log-probs."""
        batch = self.turns.generate(prompts, seed=seed, mode="train")
        model = Batch({key: batch[key] for key in ("input_ids", "attention_mask", "response_mask")})
        return batch.union(self.group.tag_rollout(model))

    def _wait(self) -> tuple[int, Batch]:
        """The batch in flight, waited for (it stays pending)."""
        step, call = self.pending
        if not isinstance(call, Batch):
            self.pending = (step, call.result())
        return self.pending

    def close(self) -> None:
        if self.turns is not None:
            self.turns.close()

    def save(self, folder: Path) -> None:
        """Write the batch in flight (waiting for it to finish generating) into a checkpoint folder."""
        if self.pending is None:
            return
        step, batch = self._wait()
        with open(folder / PENDING_FILE, "wb") as f:
            pickle.dump({"step": step, "tensors": batch.tensors, "meta": batch.meta}, f,
                        protocol=pickle.HIGHEST_PROTOCOL)

    def restore(self, folder: Path) -> None:
        """Take back the batch a checkpoint saved in flight; `start` trains on it."""
        self.restored = load_pending(folder)


def rollout_over(setup: TrainSetup, group: RoleHandle):
    """The run's rollout over the rollout group, built as the actor's is (rlctl.controller.build.policy), with its
    own tool runner and interaction (the actor's own may validate meanwhile; classes are created
    again, a file's instances shared)."""
    from rlctl.controller.setup import rollout_context
    from rlctl.rollouts.base import build_rollout

    return build_rollout(group, rollout_context(setup.config, setup.tokenizer, setup.session.config_dir))


def _in_thread(fn, *args) -> Future:
    """fn(*args) in a daemon thread (a run that fails meanwhile must not wait for it at exit)."""
    future: Future = Future()

    def run():
        try:
            future.set_result(fn(*args))
        except BaseException as e:   # surfaces in the trainer's thread, at _wait
            future.set_exception(e)

    threading.Thread(target=run, daemon=True, name="rlctl-multi-turn-rollout").start()
    return future


def load_pending(ckpt_path: Path) -> dict | None:
    """The in-flight batch a one_step_off checkpoint saved, or None."""
    path = ckpt_path / PENDING_FILE
    if not path.is_file():
        return None
    with open(path, "rb") as f:
        saved = pickle.load(f)
    if not isinstance(saved, dict) or not all(isinstance(v, np.ndarray) for v in saved["tensors"].values()):
        from rlctl.errors import CheckpointError

        raise CheckpointError(f"{path} does not hold a rollout batch", hint="resume from another checkpoint step")
    return saved
