"""`rlctl config validate` for run.kind = "sft": the keys SFT reads, and the RL keys it ignores.

An SFT config shares [run], [model], [data] (files, batch_size, shuffle, val_batch_size),
[actor] (optimizer, schedule, micro-batches) and [resources] with RL, and adds [sft]. Rollout,
reward, algorithm and critic settings mean nothing to it: a config that sets them gets a warning
per key (not an error: a file copied from an RL recipe still runs).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlctl.config.loader import LoadedConfig, Problem
from rlctl.config.plan import world_size

# Dotted keys (or whole sections, ending in ".") that an SFT run reads. data.max_response_length is
# not used in training: `rlctl eval` of the merged model generates that many tokens at most.
SFT_KEYS = ("run.", "model.", "resources.", "sft.", "data.train_files", "data.val_files", "data.batch_size",
            "data.shuffle", "data.max_response_length", "data.val_batch_size", "actor.lr", "actor.warmup_steps", "actor.lr_schedule",
            "actor.min_lr_ratio", "actor.weight_decay", "actor.grad_clip", "actor.micro_batch_size")
VAL_METRICS = ("val/loss", "val/perplexity")


@dataclass(frozen=True)
class SFTPlan:
    examples_per_step: int
    examples_per_worker: int
    micro_batching: str
    train_rows: int | None
    steps_per_epoch: int | None
    total_steps: int | None
    gpus_per_node: int | str = "auto"   # as validated: "auto" only without the machine pass
    gpus_per_node_resolved: str = ""    # why "auto" became gpus_per_node ("" when it was a number)

    @property
    def sequences_per_step(self) -> int:
        return self.examples_per_step

    def rows(self) -> list[tuple[str, object]]:
        unknown = "unknown (data files not readable)"
        return [("run kind", "sft (one optimizer step per step)"), ("examples per step", self.examples_per_step),
                ("examples per worker per step", self.examples_per_worker),
                ("micro-batches (per worker)", self.micro_batching),
                ("training rows", unknown if self.train_rows is None else self.train_rows),
                ("steps per epoch", unknown if self.steps_per_epoch is None else self.steps_per_epoch),
                ("total steps", unknown if self.total_steps is None else self.total_steps)]


def flatten(raw: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in raw.items():
        if isinstance(value, dict) and not (prefix + key).endswith("reward.weights"):
            out += flatten(value, f"{prefix}{key}.")
        else:
            out.append(prefix + key)
    return out


def unused_keys(raw: dict) -> list[str]:
    """The keys the user set that an SFT run does not read."""
    return [k for k in flatten(raw) if not any(k == s or (s.endswith(".") and k.startswith(s)) for s in SFT_KEYS)]


def validate_sft(loaded: LoadedConfig, *, machine: bool, auto_problems: list, auto: str = ""
                 ) -> tuple[list[Problem], SFTPlan]:
    from rlctl.config import validate as V

    c = loaded.config
    problems = list(auto_problems)
    for key in unused_keys(loaded.raw):
        problems.append(Problem(key, "not used by run.kind = \"sft\" (no rollouts, rewards or RL algorithm); "
                                     "remove it, or set run.kind = \"rl\"", severity="warning"))
    workers = world_size(c.resources)
    if c.data.batch_size % workers:
        problems.append(Problem("data.batch_size", f"{c.data.batch_size} examples per step cannot be split evenly over "
                                                   f"{workers} workers"))
    budget = c.sft.micro_batch_max_tokens
    if budget and budget < c.sft.max_length:
        problems.append(Problem("sft.micro_batch_max_tokens", f"{budget} is below sft.max_length = {c.sft.max_length}: "
                                                              "a sample that long runs alone, over the budget",
                                severity="warning"))
    problems += V.check_lora(c)
    problems += check_best_metric(c)
    plan = SFTPlan(examples_per_step=c.data.batch_size, examples_per_worker=max(1, c.data.batch_size // workers),
                   micro_batching=(f"by length, <= {budget} tokens each (rows x longest)" if budget
                                   else f"by length, {c.actor.micro_batch_size} rows each"),
                   train_rows=None, steps_per_epoch=None, total_steps=c.run.total_steps or None,
                   gpus_per_node=c.resources.gpus_per_node, gpus_per_node_resolved=auto)
    if machine:
        file_problems, plan = V.check_files(loaded, plan)   # fills train_rows, steps_per_epoch, total_steps
        problems += [p for p in file_problems if not p.key.startswith("reward.")]
        problems += V.check_model(loaded)
        problems += V.check_lora_targets(loaded)
        problems += [p for p in V.check_machine(c) if p.key != "rollout.engine"]
    bad_keys = {p.key for p in loaded.problems if p.severity == "error"}
    return list(loaded.problems) + [p for p in problems if p.key not in bad_keys], plan


def check_best_metric(c) -> list[Problem]:
    """RL's check against SFT's metrics (val_every = 0 warns alike), and both are better when lower."""
    from rlctl.config.validate import check_best_metric as check

    metric, problems = c.run.best_metric, check(c, known=VAL_METRICS)
    if metric in VAL_METRICS and c.data.val_files and c.run.best_mode != "min":
        problems.append(Problem("run.best_mode", f"{metric} is better when lower: set run.best_mode = \"min\"",
                                severity="warning"))
    return problems
