"""One-step off-policy training (rollout.mode = "one_step_off"): generation overlaps training.

A separate rollout group (rlctl.workers.rollout_worker) owns a copy of the policy. While the actor
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
"""

from __future__ import annotations

import pickle
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from rlctl.controller import rollout
from rlctl.runtime.batch import Batch

if TYPE_CHECKING:
    from rlctl.controller.setup import TrainSetup

PENDING_FILE = "pending_rollout.pkl"


class OneStepOff:
    """The rollout side of the loop in one_step_off mode: `rollout(step)` replaces
    rlctl.controller.rollout.rollout, `push_weights(version)` follows every actor update."""

    def __init__(self, setup: TrainSetup):
        self.setup = setup
        self.pending: tuple[int, object] | None = None   # (step, PendingCall or Batch) being generated
        self.push = None                                  # the last weight push (PendingCall)

    def start(self, first_step: int) -> None:
        """Give the rollout group the actor's current weights (update first_step - 1) and take back
        a batch a checkpoint saved in flight."""
        self.push_weights(first_step - 1)
        saved = self.setup.state.pop("pending_rollout", None)
        if saved is not None and saved["step"] == first_step:
            self.pending = (first_step, Batch(saved["tensors"], saved["meta"]))

    def push_weights(self, version: int) -> None:
        """The actor's trained weights (after `version` updates) to every rollout rank, no disk:
        rank 0 of the actor returns numpy arrays, put once in the object store for all ranks
        (the worker group puts a dict argument of an ALL call there). rollout() waits for it (a
        failed push surfaces there) before the next push."""
        self.push = self.setup.rollout.submit("update_weights", self.setup.actor.export_weights(), version=version)

    def rollout(self, step: int) -> tuple[Batch, dict]:
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
        metrics = rollout.score(batch, setup.reward, setup.tokenizer, setup.config.algorithm.gdpo_reward_keys)
        versions = batch["policy_version"]
        metrics.update({"timing/reward_s": time.perf_counter() - start, "timing/gen_wait_s": waited,
                        "rollout/policy_version": float(versions.min()),
                        "rollout/staleness": float((step - 1) - versions.min())})
        return batch, metrics

    def _submit(self, step: int) -> None:
        setup = self.setup
        prompts = rollout.prompt_batch(setup.loader.next_batch(), f"{step}.1", setup.pad_token_id)
        self.pending = (step, setup.rollout.submit("generate", prompts, seed=setup.seed_for(step, 1)))

    def _wait(self) -> tuple[int, Batch]:
        """The batch in flight, waited for (it stays pending)."""
        step, call = self.pending
        if not isinstance(call, Batch):
            self.pending = (step, call.result())
        return self.pending

    def save(self, folder: Path) -> None:
        """Write the batch in flight (waiting for it to finish generating) into a checkpoint folder."""
        if self.pending is None:
            return
        step, batch = self._wait()
        with open(folder / PENDING_FILE, "wb") as f:
            pickle.dump({"step": step, "tensors": batch.tensors, "meta": batch.meta}, f,
                        protocol=pickle.HIGHEST_PROTOCOL)


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
