"""Cross-field rules and checks against the machine, plus the batch plan.

`load_config` has already type-checked every key. Here we look at how keys fit together
(batch sizes that divide, estimators that need groups or a critic, LoRA sanity, lengths vs the
model's context) and, in the second pass, at the machine (files, GPUs, optional packages).
Everything is collected into a list of Problems; nothing stops at the first one.
"""

from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from rlctl.config.loader import LoadedConfig, Problem
from rlctl.config.plan import batch_plan
from rlctl.config.schema import Config

BUILTIN_REWARDS = ("gsm8k", "math", "arith")  # rlctl.rewards.builtin.BUILTINS, without importing it


@dataclass(frozen=True)
class BatchPlan:
    prompts_per_step: int
    sequences_per_step: int
    mini_batches_per_rollout: int  # optimizer steps per rollout = ppo_epochs x mini-batches
    micro_batches_per_optimizer_step: int  # per worker (gradient accumulation steps)
    sequences_per_worker_per_mini_batch: int
    train_rows: int | None
    steps_per_epoch: int | None
    total_steps: int | None

    def rows(self) -> list[tuple[str, object]]:
        unknown = "unknown (data files not readable)"
        return [("prompts per step", self.prompts_per_step),
                ("sequences per step", self.sequences_per_step),
                ("optimizer steps per rollout", self.mini_batches_per_rollout),
                ("micro-batches per optimizer step (per worker)", self.micro_batches_per_optimizer_step),
                ("sequences per worker per optimizer step", self.sequences_per_worker_per_mini_batch),
                ("training rows", unknown if self.train_rows is None else self.train_rows),
                ("steps per epoch", unknown if self.steps_per_epoch is None else self.steps_per_epoch),
                ("total steps", unknown if self.total_steps is None else self.total_steps)]


def estimator_needs(name: str):
    """The estimator's declared needs (critic, groups, greedy baseline) from the registry."""
    from rlctl.algorithms import get_estimator

    return get_estimator(name)


def check_registered(loaded: LoadedConfig) -> tuple[list[Problem], Config]:
    """Import algorithm.plugins, then check algorithm.name and actor.policy_loss against the
    registries. Returns the problems and the config to check further: an unknown name is
    replaced by its default there, so that rules about it do not mislead."""
    import dataclasses

    from rlctl.algorithms import estimator_names, policy_loss_names
    from rlctl.config.loader import suggest
    from rlctl.errors import ConfigError
    from rlctl.plugins import import_plugins

    c, problems = loaded.config, []
    try:
        import_plugins(c.algorithm.plugins, loaded.base_dir)
    except ConfigError as err:
        problems.append(Problem("algorithm.plugins", err.message.removeprefix("algorithm.plugins: ")))
    for key, names, default in (("algorithm.name", estimator_names(), Config().algorithm.name),
                                ("actor.policy_loss", policy_loss_names(), Config().actor.policy_loss)):
        section, field = key.split(".")
        value = getattr(getattr(c, section), field)
        if value not in names:
            problems.append(Problem(key, f"{value!r} is not a registered name ({', '.join(names)}){suggest(value, names)}"
                                         "; register your own in a file listed in algorithm.plugins"))
            c = dataclasses.replace(c, **{section: dataclasses.replace(getattr(c, section), **{field: default})})
    return problems, c


def check_batches(c: Config) -> tuple[list[Problem], BatchPlan]:
    problems = []
    n, workers = c.rollout.n, c.resources.workers
    roles = ("actor", "critic") if estimator_needs(c.algorithm.name).needs_critic else ("actor",)
    for role in roles:
        sect, role_plan = getattr(c, role), batch_plan(c, role)
        mini = role_plan.prompts_per_mini_batch
        if c.data.batch_size % mini:
            problems.append(Problem(f"{role}.mini_batch_size",
                                    f"{mini} prompts does not divide data.batch_size = {c.data.batch_size}"))
            continue
        seqs = role_plan.sequences_per_mini_batch
        if seqs % workers:
            problems.append(Problem(f"{role}.mini_batch_size",
                                    f"{mini} prompts x rollout.n {n} = {seqs} sequences cannot be split evenly "
                                    f"over resources.workers = {workers}"))
            continue
        per_worker = seqs // workers
        if per_worker % sect.micro_batch_size:
            problems.append(Problem(f"{role}.micro_batch_size",
                                    f"{sect.micro_batch_size} does not divide the {per_worker} sequences each worker "
                                    f"gets per optimizer step ({mini} prompts x n {n} / {workers} workers)"))
    actor = batch_plan(c, "actor")
    plan = BatchPlan(
        prompts_per_step=c.data.batch_size, sequences_per_step=c.data.batch_size * n,
        mini_batches_per_rollout=actor.optimizer_steps_per_rollout,
        micro_batches_per_optimizer_step=actor.micro_batches_per_optimizer_step,
        sequences_per_worker_per_mini_batch=actor.sequences_per_worker, train_rows=None, steps_per_epoch=None,
        total_steps=c.run.total_steps or None)
    return problems, plan


def check_algorithm(c: Config, raw: dict) -> list[Problem]:
    problems = []
    spec = estimator_needs(c.algorithm.name)
    if spec.needs_group and c.rollout.n < 2:
        problems.append(Problem("rollout.n", f"algorithm {c.algorithm.name!r} compares samples within a group of "
                                             f"the same prompt and needs rollout.n >= 2 (got {c.rollout.n})"))
    if c.algorithm.dynamic_sampling.enable and c.rollout.n < 2:
        problems.append(Problem("algorithm.dynamic_sampling.enable",
                                "dynamic sampling keeps groups whose rewards differ, so it needs rollout.n >= 2"))
    if spec.needs_critic and "critic" not in raw:
        problems.append(Problem("critic", f"algorithm {c.algorithm.name!r} trains a value model: add a [critic] "
                                          "section (e.g. lr = 1e-5)"))
    if not spec.needs_critic and "critic" in raw:
        problems.append(Problem("critic", f"[critic] is unused by algorithm {c.algorithm.name!r} and is ignored",
                                severity="warning"))
    if c.rollout.temperature == 0 and c.rollout.n > 1:
        problems.append(Problem("rollout.temperature", "0 (greedy) makes all rollout.n samples identical, so "
                                                        "group advantages are zero", severity="warning"))
    if c.reward.overlong.enable and c.reward.overlong.buffer_len > c.data.max_response_length:
        problems.append(Problem("reward.overlong.buffer_len", f"{c.reward.overlong.buffer_len} is longer than "
                                                              f"data.max_response_length = {c.data.max_response_length}"))
    if c.actor.use_kl_loss and c.algorithm.kl_in_reward:
        problems.append(Problem("actor.use_kl_loss", "KL is both in the reward (algorithm.kl_in_reward) and in the "
                                                    "loss; usually you want one of them", severity="warning"))
    if c.actor.clip_ratio_high < c.actor.clip_ratio_low and c.actor.policy_loss == "vanilla":
        problems.append(Problem("actor.clip_ratio_high", "is below clip_ratio_low; DAPO's clip-higher uses "
                                                         "high >= low (e.g. 0.28 vs 0.2)", severity="warning"))
    return problems + check_rollout_engine(c)


def check_rollout_engine(c: Config) -> list[Problem]:
    """The engine's declared limits (rlctl.workers.rollout.registry): tensor-parallel size, temperature."""
    from rlctl.workers.rollout.registry import rollout_engine_info, sharding_engines

    engine = rollout_engine_info(c.rollout.engine)
    tp, most, gpus = c.rollout.tensor_parallel_size, engine.max_tensor_parallel_size, c.resources.gpus_per_node
    problems = []
    if most is not None and tp > most:
        others = " or ".join(f'"{n}"' for n in sharding_engines())
        problems.append(Problem("rollout.tensor_parallel_size", f"{tp}: the {engine.name} training rollout runs one "
                                f"engine per GPU rank (tensor-parallel {most}); set it to {most}, or use "
                                f"rollout.engine = {others}"))
    elif tp != 1 and gpus and gpus % tp:
        problems.append(Problem("rollout.tensor_parallel_size", f"{tp}: a {engine.title} engine spans {tp} GPUs of one "
                                f"node, but resources.gpus_per_node = {gpus} is not a multiple of it"))
    if engine.max_temperature is not None and c.rollout.temperature > engine.max_temperature:
        problems.append(Problem("rollout.temperature", f"{c.rollout.temperature:g}: {engine.title} samples with "
                                                       f"temperature <= {engine.max_temperature:g}"))
    return problems


def check_lora(c: Config) -> list[Problem]:
    lora = c.model.lora
    if lora.rank == 0:
        return []
    problems = []
    if not lora.target_modules:
        problems.append(Problem("model.lora.target_modules", "is empty; name the modules that get adapters"))
    if lora.alpha / lora.rank > 16 or lora.alpha / lora.rank < 1 / 16:
        problems.append(Problem("model.lora.alpha", f"alpha/rank = {lora.alpha / lora.rank:g} is far from the usual "
                                                    "0.5-4; updates will be tiny or explosive", severity="warning"))
    if c.actor.lr < 1e-6:
        problems.append(Problem("actor.lr", f"{c.actor.lr:g} is very low for LoRA (usually 1e-5 to 1e-4)",
                                severity="warning"))
    return problems


def _resolve(base: Path, p: str) -> Path:
    path = Path(p).expanduser()
    return path if path.is_absolute() else base / path


def check_files(loaded: LoadedConfig, plan: BatchPlan) -> tuple[list[Problem], BatchPlan]:
    c, base = loaded.config, loaded.base_dir
    problems, rows = [], 0
    for key in ("train_files", "val_files"):
        for p in getattr(c.data, key):
            path = _resolve(base, p)
            if not path.is_file():
                problems.append(Problem(f"data.{key}", f"{p} does not exist (looked in {path.parent}); "
                                                       "create it with `rlctl data prep ...`"))
            elif key == "train_files" and rows is not None:
                rows = _add_rows(rows, path)
    if c.reward.function and c.reward.function not in BUILTIN_REWARDS:
        file, _, fn = c.reward.function.rpartition(":")
        if not file or not fn:
            problems.append(Problem("reward.function", f"{c.reward.function!r} is neither \"file.py:function\" "
                                                       f"nor a built-in ({', '.join(BUILTIN_REWARDS)})"))
        elif not _resolve(base, file).is_file():
            problems.append(Problem("reward.function", f"{file} does not exist (relative to {base})"))
    if rows and not problems:
        steps = rows // c.data.batch_size
        if steps == 0:
            problems.append(Problem("data.batch_size", f"{c.data.batch_size} prompts per step but only {rows} "
                                                       "training rows"))
        total = c.run.total_steps or steps * c.run.total_epochs
        plan = BatchPlan(**{**plan.__dict__, "train_rows": rows, "steps_per_epoch": steps, "total_steps": total})
    return problems, plan


def _add_rows(rows: int, path: Path) -> int | None:
    try:
        import pyarrow.parquet as pq

        return rows + pq.ParquetFile(path).metadata.num_rows
    except Exception:
        return None  # a broken file is reported by `rlctl data inspect` / at train start


def check_model(loaded: LoadedConfig) -> list[Problem]:
    c = loaded.config
    path = _resolve(loaded.base_dir, c.model.path)
    local = path.exists() or c.model.path.startswith((".", "/", "~"))
    if not local:
        return []  # a hub id: resolved at train time (a clear error when offline)
    if not (path / "config.json").is_file():
        return [Problem("model.path", f"{c.model.path} has no config.json; point it at a Hugging Face model "
                                      "folder (or make one: `rlctl model tiny models/tiny`)")]
    try:
        hf = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        return [Problem("model.path", f"{path / 'config.json'} is unreadable: {e}")]
    ctx = hf.get("max_position_embeddings")
    total = c.data.max_prompt_length + c.data.max_response_length
    if isinstance(ctx, int) and total > ctx:
        return [Problem("data.max_response_length", f"max_prompt_length + max_response_length = {total} exceeds "
                                                    f"the model's context of {ctx} tokens")]
    return []


def check_machine(c: Config) -> list[Problem]:
    problems = []
    from rlctl.workers.rollout.registry import rollout_engine_info

    engine = rollout_engine_info(c.rollout.engine)
    if engine.gpu_only and c.resources.gpus_per_node == 0:
        problems.append(Problem("rollout.engine", f"{engine.name!r} runs on GPUs only; set resources.gpus_per_node "
                                                  "or use engine = \"hf\" on CPU"))
    elif engine.extra and importlib.util.find_spec(engine.extra) is None:
        problems.append(Problem("rollout.engine", f"{engine.name!r} is not installed; "
                                                  f"pip install \"rlctl[{engine.extra}]\""))
    for logger, pkg in (("tensorboard", "tensorboard"), ("wandb", "wandb")):
        if logger in c.run.loggers and importlib.util.find_spec(pkg) is None:
            problems.append(Problem("run.loggers", f"{logger!r} is configured but not installed; "
                                                   f"pip install \"rlctl[{logger}]\""))
    if c.resources.gpus_per_node and not c.resources.address and not _cuda_available():
        problems.append(Problem("resources.gpus_per_node", f"{c.resources.gpus_per_node} GPU(s) requested but no "
                                                           "CUDA GPU is visible; set resources.gpus_per_node = 0 for CPU"))
    return problems


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def validate(loaded: LoadedConfig, *, machine: bool = True) -> tuple[list[Problem], BatchPlan]:
    """All problems (errors and warnings) of a type-checked config, and its batch plan."""
    problems, c = check_registered(loaded)
    batch_problems, plan = check_batches(c)
    problems += batch_problems + check_algorithm(c, loaded.raw) + check_lora(c)
    if machine:
        file_problems, plan = check_files(loaded, plan)
        problems += file_problems + check_model(loaded) + check_machine(c)
    # A key that failed its own check keeps its default: rules about it would mislead.
    bad_keys = {p.key for p in loaded.problems if p.severity == "error"}
    return list(loaded.problems) + [p for p in problems if p.key not in bad_keys], plan
