"""What the controller asks of the policy: the actor's RPCs as a Protocol, and the rollout rows.

`PolicyActor` lists every call the RL controller makes on the policy (trainer, perf, checkpointing,
one-step-off weight pushes). `PolicyHandle` implements it over the actor role of a worker group
(rlctl.workers.roles.actor.ActorRolloutRefWorker on every rank); rlctl.rollouts.base.RolloutPolicy is
one that holds the run's kind of rollout for `generate`. `TurnGenerator` is the part a turn loop
drives: one `generate_turn` per turn over `world_size` ranks. `rollout_batch` builds the rows every
generator returns (the actor's, the one-step-off rollout group's and the tool loop's), so they
concatenate and train alike.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

from rlctl.runtime.batch import Batch

if TYPE_CHECKING:
    from rlctl.runtime.worker_group import RoleHandle

MODEL_KEYS = ("input_ids", "attention_mask")   # the prompt columns a rollout row rebuilds


class TurnGenerator(Protocol):
    """One assistant turn on every rank (rlctl.workers.roles.actor.ActorRolloutRefWorker.generate_turn)."""

    @property
    def world_size(self) -> int: ...

    def generate_turn(self, batch: Batch, *, seed: int, mode: str = "train", n: int = 1,
                      width: int = 0, log_probs: bool = False) -> Batch: ...


class PolicyActor(TurnGenerator, Protocol):
    """The policy's calls, as the controller makes them (batch keys: rlctl.workers.roles.actor)."""

    def generate(self, batch: Batch, *, seed: int, mode: str = "train") -> Batch: ...

    def compute_log_prob(self, batch: Batch) -> Batch: ...

    def compute_ref_log_prob(self, batch: Batch) -> Batch: ...

    def update_actor(self, batch: Batch) -> dict[str, float]: ...

    def sync_reference(self) -> None: ...

    def flops_profile(self) -> list[dict]: ...

    def save_checkpoint(self, path: str) -> None: ...

    def load_checkpoint(self, path: str) -> dict: ...

    def export_weights(self) -> dict | None: ...


class PolicyHandle:
    """`PolicyActor` over the actor role of a worker group: each call runs on every rank with the
    dispatch its worker method registered (rlctl.runtime.worker_group.RoleHandle)."""

    def __init__(self, role: RoleHandle | PolicyActor | TurnGenerator):
        self.role = role

    @property
    def world_size(self) -> int:
        return self.role.world_size

    def generate(self, batch: Batch, *, seed: int, mode: str = "train") -> Batch:
        return self.role.generate(batch, seed=seed, mode=mode)

    def generate_turn(self, batch: Batch, *, seed: int, mode: str = "train", n: int = 1, width: int = 0,
                      log_probs: bool = False) -> Batch:
        return self.role.generate_turn(batch, seed=seed, mode=mode, n=n, width=width, log_probs=log_probs)

    def compute_log_prob(self, batch: Batch) -> Batch:
        return self.role.compute_log_prob(batch)

    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        return self.role.compute_ref_log_prob(batch)

    def update_actor(self, batch: Batch) -> dict[str, float]:
        return self.role.update_actor(batch)

    def sync_reference(self) -> None:
        self.role.sync_reference()

    def flops_profile(self) -> list[dict]:
        return self.role.flops_profile()

    def save_checkpoint(self, path: str) -> None:
        return self.role.save_checkpoint(path)

    def load_checkpoint(self, path: str) -> dict:
        return self.role.load_checkpoint(path)

    def export_weights(self) -> dict | None:
        return self.role.export_weights()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.role!r})"


def rollout_batch(prompts: Batch, out: dict, n: int, *, width: int, pad: int) -> Batch:
    """B prompts + the engine's B*n responses -> rows of [prompt ++ response] (prompt-major).

    Prompts are left-padded to `width` (data.max_prompt_length) so that batches from different
    generate calls (dynamic sampling, several ranks) have the same P and concatenate."""
    extra = max(0, width - prompts["input_ids"].shape[1])
    prompt_ids = np.pad(np.repeat(prompts["input_ids"], n, axis=0), ((0, 0), (extra, 0)), constant_values=pad)
    prompt_mask = np.pad(np.repeat(prompts["attention_mask"], n, axis=0).astype(np.int64), ((0, 0), (extra, 0)))
    responses = out["responses"].astype(np.int64)
    response_mask = out["response_mask"].astype(np.int64)
    rows = {
        "prompts": prompt_ids, "responses": responses,
        "response_mask": response_mask.astype(np.float32),
        "response_length": out["response_length"].astype(np.int64),
        "truncated": np.asarray(out["truncated"], dtype=bool),
        "input_ids": np.concatenate([prompt_ids, responses], axis=1),
        "attention_mask": np.concatenate([prompt_mask, response_mask], axis=1),
    }
    if "rollout_log_prob" in out:   # GPU engines: their log-prob of each sampled token
        rows["rollout_log_prob"] = out["rollout_log_prob"].astype(np.float32)
    if "position_ids" in out:   # vision models: the M-RoPE positions [B*n, 3, P'+T] the engine sampled with
        positions = out["position_ids"]
        extra_pos = prompt_ids.shape[1] + responses.shape[1] - positions.shape[2]
        rows["position_ids"] = np.pad(positions.astype(np.int64), ((0, 0), (0, 0), (extra_pos, 0)))
    carried = {k: np.repeat(v, n, axis=0) for k, v in prompts.tensors.items() if k not in MODEL_KEYS}
    return Batch({**carried, **rows}, prompts.meta)
