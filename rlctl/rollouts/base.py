"""The `Rollout` protocol every kind of the rollout table implements, and the policy that holds one.

    rollout = build_rollout(turns, RolloutContext(config, tokenizer, base, eos_ids, ...))
    batch = rollout.generate(prompts, seed=seed, mode="train")   # through `turns`, the policy's turn generator
    metrics = rollout.score(batch, reward, tokenizer)              # scores, acc, response_text columns

`turns` is whatever generates for this process: the actor group (sync mode, validation, ReMax's
greedy baseline), the separate rollout group (one_step_off, async) or a model in this process
(`rlctl eval`); every caller builds the rollout the same way. `RolloutPolicy` is the policy as the
trainer calls it: its rollout generates, the actor group does every other call.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

from rlctl.rollouts.table import kind_of
from rlctl.runtime.policy import PolicyActor, PolicyHandle

if TYPE_CHECKING:
    import numpy as np

    from rlctl.config.schema import Config
    from rlctl.runtime.batch import Batch
    from rlctl.runtime.policy import TurnGenerator
    from rlctl.runtime.worker_group import RoleHandle


@dataclass(frozen=True)
class RolloutContext:
    """What every kind is built from, besides the turn generator."""

    config: Config
    tokenizer: Any
    base: Path                     # where the config's relative paths start (tools, agents, interactions)
    eos_ids: list[int]
    engine_log_probs: bool = False  # the rollout engine reports rollout_log_prob (its registry entry)
    tools: list | None = None       # the configured tools when the caller loaded them already
    minibatches: int = 1            # mini-batches per step: a kind whose rows vary pads to whole ones

    @property
    def pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad) if pad is not None else int(self.eos_ids[0])


class Rollout(Protocol):
    """One kind of rollout (a row of rlctl.rollouts.table.KINDS)."""

    def generate(self, batch: Batch, *, seed: int, mode: str = "train") -> Batch:
        """Prompts (rlctl.controller.rollout.prompt_batch) -> rows of [prompt ++ response]: mode "train"
        (rollout.n samples each), "val" (val_n) or "greedy" (one argmax sample)."""

    def score(self, batch: Batch, reward: Any, tokenizer: Any, components: tuple = ()) -> dict:
        """Store `scores`, `acc`, `response_text` (and `reward_component/<name>`); return the metrics."""

    def sample_rows(self, batch: Batch) -> np.ndarray:
        """The rows that stand for the batch's samples, one each (means over samples take these)."""

    def record_fields(self, batch: Batch, r: int) -> dict:
        """Row r's own fields in the rollouts dump (rlctl.controller.rollout_log), beside the common ones."""

    def watch(self, step: int, batch: Batch, say: Callable[[str], None]) -> None:
        """After a scored training batch: the kind's own console lines about it (`say`), or a stop (an error)."""

    def join_groups(self, rounds: list[Batch], groups: int, world_size: int) -> Batch:
        """Dynamic sampling's kept rounds as one training batch of their first `groups` groups."""

    @property
    def prompt_tools(self) -> list[dict]:
        """The tool schemas its prompts show (rendered into the chat template)."""

    def close(self) -> None: ...


class TurnRollout(Rollout, Protocol):
    """A kind that drives its turn generator from this process (its row's `one_call` is False): `rlctl
    eval` runs it over a model in this process (rlctl.serve.eval_turns) and asks it what each sample is."""

    def eval_samples(self, batch: Batch, tokenizer: Any) -> list[tuple[dict, dict]]:
        """Per sample (sample_rows, prompt-major): (the reward's item, the eval record's own fields)."""


def build_rollout(turns: TurnGenerator | PolicyActor | RoleHandle, ctx: RolloutContext) -> Rollout:
    """The run's kind of rollout over `turns` (the config's row of the rollout table)."""
    return kind_of(ctx.config).rollout_class()(turns, ctx)


class RolloutPolicy(PolicyHandle):
    """The policy with its rollout's `generate` (rlctl.runtime.policy.PolicyActor); every other call
    goes to the actor group (PolicyHandle's forwarding)."""

    def __init__(self, role: RoleHandle | PolicyActor, rollout: Rollout):
        super().__init__(role)
        self.rollout = rollout

    def generate(self, batch: Batch, *, seed: int, mode: str = "train") -> Batch:
        return self.rollout.generate(batch, seed=seed, mode=mode)
