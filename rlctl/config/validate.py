"""Cross-field rules and checks against the machine, plus the batch plan.

`load_config` has already type-checked every key. Here we look at how keys fit together
(batch sizes that divide, estimators that need groups or a critic, LoRA sanity, lengths vs the
model's context) and, in the second pass, at the machine (files, GPUs, optional packages).
Everything is collected into a list of Problems; nothing stops at the first one.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path

from rlctl.config.loader import LoadedConfig, Problem
from rlctl.config.plan import batch_plan, world_size
from rlctl.config.schema import Config

BUILTIN_REWARDS = ("gsm8k", "math", "arith", "arith_exact", "code", "calc-tools")  # rlctl.rewards.builtin.BUILTINS, without importing it


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
    gpus_per_node: int | str = "auto"   # as validated: "auto" only without the machine pass
    gpus_per_node_resolved: str = ""    # why "auto" became gpus_per_node ("" when it was a number)

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
    n, workers = c.rollout.n, world_size(c.resources)
    over = (f"resources.workers = {workers}" if workers == c.resources.workers
            else f"the {workers} GPU workers (resources.nodes x gpus_per_node)")
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
                                    f"over {over}"))
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
        total_steps=c.run.total_steps or None, gpus_per_node=c.resources.gpus_per_node)
    return problems, plan


def check_algorithm(c: Config, raw: dict) -> list[Problem]:
    problems = []
    spec = estimator_needs(c.algorithm.name)
    if spec.needs_group and c.rollout.n < 2:
        problems.append(Problem("rollout.n", f"algorithm {c.algorithm.name!r} compares samples within a group of "
                                             f"the same prompt and needs rollout.n >= 2 (got {c.rollout.n})"))
    keys, weights = c.algorithm.gdpo_reward_keys, c.algorithm.gdpo_reward_weights
    if spec.needs_reward_components and not keys:
        problems.append(Problem("algorithm.gdpo_reward_keys", f"algorithm {c.algorithm.name!r} normalises each reward "
                                "component on its own: list the keys your reward function returns in its dict, "
                                "e.g. [\"format\", \"accuracy\"]"))
    if weights and len(weights) != len(keys):
        problems.append(Problem("algorithm.gdpo_reward_weights", f"has {len(weights)} weights for {len(keys)} "
                                "gdpo_reward_keys: give one per key, or none (1 each)"))
    rc = c.algorithm.rollout_correction
    if rc.rollout_rs:
        from rlctl.algorithms import AlgorithmError
        from rlctl.algorithms.rollout_correction import parse_rollout_rs

        try:
            parse_rollout_rs(rc.rollout_rs, rc.rollout_rs_threshold)
        except AlgorithmError as err:
            problems.append(Problem("algorithm.rollout_correction.rollout_rs", str(err)))
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
    if rc.bypass_mode:
        from rlctl.workers.rollout.registry import rollout_engine_info

        if c.rollout.mode != "one_step_off" and not rollout_engine_info(c.rollout.engine).owns_weights:
            problems.append(Problem("algorithm.rollout_correction.bypass_mode", "takes the rollout engine's log-probs "
                                    "as old_log_prob, and the hf engine of rollout.mode = \"sync\" reports none: use "
                                    "rollout.mode = \"one_step_off\" or a vLLM/SGLang engine"))
        if spec.needs_sum_pi_squared:
            problems.append(Problem("algorithm.rollout_correction.bypass_mode", "skips the trainer's log-prob pass, "
                                    f"which gives algorithm {c.algorithm.name!r} its sum_pi_squared: turn bypass_mode "
                                    "off"))
        if c.actor.policy_loss != "vanilla":
            problems.append(Problem("algorithm.rollout_correction.bypass_mode", f"replaces actor.policy_loss = "
                                    f"{c.actor.policy_loss!r} by loss_type = {rc.loss_type!r} (as verl does)",
                                    severity="warning"))
    if c.actor.policy_loss == "dro" and not c.actor.dro_beta > 0:
        problems.append(Problem("actor.dro_beta", "policy_loss = \"dro\" weighs its quadratic penalty by dro_beta, "
                                                  "which has no default: set it > 0 (e.g. 0.1)"))
    return problems + check_rollout_engine(c) + check_one_step_off(c, raw)


def check_one_step_off(c: Config, raw: dict) -> list[Problem]:
    """rollout.mode = "one_step_off": what the separate rollout group supports so far."""
    if c.rollout.mode != "one_step_off":
        if "rollout_workers" in raw.get("resources", {}):
            return [Problem("resources.rollout_workers", "is used only with rollout.mode = \"one_step_off\" and is "
                                                         "ignored", severity="warning")]
        return []
    problems = []
    gpus = c.resources.gpus_per_node
    if c.rollout.engine != "hf":
        problems.append(Problem("rollout.mode", f"\"one_step_off\" generates with the hf engine in its own group; "
                                f"rollout.engine = {c.rollout.engine!r} there is not built yet: use rollout.engine = "
                                "\"hf\" or rollout.mode = \"sync\""))
    if isinstance(gpus, int) and gpus > 0:
        problems.append(Problem("rollout.mode", "\"one_step_off\" splits CPU workers between the actor and the "
                                "rollout group; GPU placement of the rollout group is not built yet: set "
                                "resources.gpus_per_node = 0 or rollout.mode = \"sync\""))
    if c.algorithm.dynamic_sampling.enable:
        problems.append(Problem("algorithm.dynamic_sampling.enable", "dynamic sampling decides how many batches to "
                                "generate from their rewards, which one_step_off generates a step ahead: turn one "
                                "of them off"))
    if c.data.batch_size < c.resources.rollout_workers:
        problems.append(Problem("resources.rollout_workers", f"{c.resources.rollout_workers} rollout workers for "
                                f"data.batch_size = {c.data.batch_size} prompts: every worker needs a prompt; use at "
                                "most data.batch_size"))
    return problems


def check_cpu_split(c: Config) -> list[Problem]:
    """Embedded Ray on CPU: the groups' ranks x cpus_per_worker must fit this machine's cores."""
    res = c.resources
    if res.address or res.gpus_per_node not in (0, "auto") or c.rollout.mode != "one_step_off":
        return []
    from rlctl.runtime.ray_env import machine_cpus

    need, have = (res.workers + res.rollout_workers) * res.cpus_per_worker, machine_cpus()
    if need <= have:
        return []
    return [Problem("resources.rollout_workers", f"the actor ({res.workers}) and rollout ({res.rollout_workers}) "
                    f"workers x cpus_per_worker = {res.cpus_per_worker} need {need} CPUs, this machine has {have}: "
                    "lower resources.workers, rollout_workers or cpus_per_worker")]


def check_rollout_engine(c: Config) -> list[Problem]:
    """The engine's declared limits (rlctl.workers.rollout.registry): tensor-parallel size, temperature."""
    from rlctl.workers.rollout.registry import rollout_engine_info, sharding_engines

    engine = rollout_engine_info(c.rollout.engine)
    tp, most, gpus = c.rollout.tensor_parallel_size, engine.max_tensor_parallel_size, c.resources.gpus_per_node
    gpus = gpus if isinstance(gpus, int) else 0   # "auto" before it is resolved (--skip-machine)
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


def check_reward(c: Config, *, reach: bool) -> list[Problem]:
    """Model-based reward sources: a judge needs a model name and a usable prompt and score rule;
    weights name configured sources; the judge, reward service and SandboxFusion URLs are http(s)
    URLs, and with `reach` something answers at each (a warning: it may start later)."""
    from rlctl.errors import ConfigError
    from rlctl.rewards.http import check_reachable, check_url
    from rlctl.rewards.remote import check_prompt, score_reader
    from rlctl.rewards.sources import uses_function

    r, problems = c.reward, []
    if r.judge_url and not r.judge_model:
        problems.append(Problem("reward.judge_model", "is empty but reward.judge_url is set: name the model the "
                                                      "judge server serves"))
    checks = [("judge_prompt", lambda: check_prompt(r.judge_prompt)),
              ("judge_score", lambda: score_reader(r.judge_score))]
    url_check = check_reachable if reach else check_url
    checks += [(key, lambda u=url, k=key: url_check(u, k)) for key, url in
               (("judge_url", r.judge_url.rstrip("/")), ("remote_url", r.remote_url),
                ("sandbox_url", r.sandbox_url)) if url]
    for key, check in checks:
        try:
            check()
        except ConfigError as err:
            unreachable = "nothing answers" in err.message
            problems.append(Problem(f"reward.{key}", err.message.removeprefix(f"reward.{key}: ").removeprefix(
                f"reward.{key} "), severity="warning" if unreachable else "error"))
    configured = {"function": uses_function(r), "model": bool(r.model), "judge": bool(r.judge_url),
                  "remote": bool(r.remote_url)}
    keys = {"function": "function", "model": "model", "judge": "judge_url", "remote": "remote_url"}
    for name in r.weights:
        if not configured.get(name, True):
            problems.append(Problem("reward.weights", f"weights {name!r}, a source that is not configured "
                                                      f"(set reward.{keys[name]})"))
    return problems


def check_reward_model_path(model: str, base: Path) -> list[Problem]:
    """reward.model written as a path (./, /, ~) must exist; anything else may be a hub id."""
    path = Path(model).expanduser()
    path = path if path.is_absolute() else base / path
    if model.startswith((".", "/", "~")) and not path.is_dir():
        return [Problem("reward.model", f"{path} is not a folder; make one with `rlctl model tiny OUT --reward-model` "
                                        "or point at a sequence-classification model")]
    return []


def check_lora(c: Config) -> list[Problem]:
    lora = c.model.lora
    if lora.rank == 0:
        return []
    problems = []
    if not lora.target_modules:
        problems.append(Problem("model.lora.target_modules", "is empty; name the modules that get adapters"))
    elif "all-linear" in [str(t).lower() for t in lora.target_modules] and len(lora.target_modules) > 1:
        problems.append(Problem("model.lora.target_modules", "\"all-linear\" already covers every linear layer; "
                                                             "use it alone, or list layer names without it"))
    if lora.alpha / lora.rank > 16 or lora.alpha / lora.rank < 1 / 16:
        problems.append(Problem("model.lora.alpha", f"alpha/rank = {lora.alpha / lora.rank:g} is far from the usual "
                                                    "0.5-4; updates will be tiny or explosive", severity="warning"))
    if c.actor.lr < 1e-6:
        problems.append(Problem("actor.lr", f"{c.actor.lr:g} is very low for LoRA (usually 1e-5 to 1e-4)",
                                severity="warning"))
    return problems


# What a validation logs, as `val/<name>` and `val/<data_source>/<name>`: the mean of a batch column
# (rlctl.controller.trainer.validation_metrics computes them from these; run.best_metric names one).
VAL_METRIC_COLUMNS = {"reward/mean": "scores", "acc": "acc", "response_length/mean": "response_length"}
VAL_METRICS_PER_SOURCE = ("reward/mean", "acc")


def validation_metric_names(data_sources=()) -> list[str]:
    """The val/ metrics a validation logs: overall, then reward and accuracy per data source."""
    return [f"val/{m}" for m in VAL_METRIC_COLUMNS] + \
        [f"val/{ds}/{m}" for ds in sorted(data_sources) for m in VAL_METRICS_PER_SOURCE]


def check_best_metric(c: Config, data_sources: set[str] | None = None, known=None) -> list[Problem]:
    """run.best_metric must be a metric validation logs: one of `known` (SFT's), or of RL's, where
    data_sources (those of data.val_files, or None when unread) decide the per-source names."""
    from rlctl.config.loader import suggest

    metric = c.run.best_metric
    if not metric:
        return []
    if not c.data.val_files:
        return [Problem("run.best_metric", f"{metric!r} is a validation metric but the run does not validate; "
                                           "set data.val_files (and run.val_every), or run.best_metric = \"\"")]
    rl = known is None
    known = validation_metric_names(data_sources or ()) if rl else list(known)
    source = metric.removeprefix("val/").removesuffix("/acc").removesuffix("/reward/mean")
    per_source = rl and metric.startswith("val/") and source not in ("", metric.removeprefix("val/"))  # val/<ds>/...
    if metric in known or (data_sources is None and per_source):
        problems = []
    else:
        problems = [Problem("run.best_metric", f"{metric!r} is not a metric validation logs{suggest(metric, known)}; "
                                               f"it logs {', '.join(known)}")]
    if c.run.val_every == 0:
        problems.append(Problem("run.best_metric", "run.val_every = 0 validates only at the last step, so the best "
                                                   "checkpoint is the last one; set run.val_every", severity="warning"))
    return problems


def _val_data_sources(loaded: LoadedConfig) -> set[str] | None:
    """The data_source values of data.val_files; None when a file cannot be read."""
    try:
        import pyarrow.parquet as pq

        return {ds for p in loaded.config.data.val_files
                for ds in pq.read_table(_resolve(loaded.base_dir, p), columns=["data_source"])
                .column("data_source").to_pylist()}
    except Exception:
        return None   # a missing or broken file is reported by check_files / `rlctl data inspect`


def check_lora_targets(loaded: LoadedConfig) -> list[Problem]:
    """Every name in model.lora.target_modules must match a layer of the model: read from its
    config.json on the meta device (no weights). A model not on disk (a hub id not yet
    downloaded) is checked by the workers at train start instead; "all-linear" matches any model."""
    from rlctl.errors import DataError
    from rlctl.models.hub import resolve_model
    from rlctl.workers.lora import is_all_linear, meta_model, mismatch_message

    c = loaded.config
    lora = c.model.lora
    if lora.rank == 0 or not lora.target_modules or is_all_linear(lora.target_modules):
        return []
    try:   # a local folder or the cached snapshot of a hub id (the probe is cached: check_model made it)
        path = resolve_model(c.model.path, loaded.base_dir).folder
    except DataError:
        return []   # reported by check_model
    if path is None or not (path / "config.json").is_file():
        return []

    try:
        model = meta_model(str(path), c.model.trust_remote_code)
    except Exception:  # noqa: BLE001 - an architecture transformers cannot build fails at load, with its reason
        return []
    message = mismatch_message(model, lora.target_modules)
    return [Problem("model.lora.target_modules", message)] if message else []


def check_multi_turn(c: Config, base: Path | None) -> list[Problem]:
    """[rollout.multi_turn]: names of tools and the interaction; with `base` (the machine pass)
    each is imported, and each tool's schema derived, so a bad file:name or a tool without type
    hints is reported here, not mid-run."""
    from rlctl.config.schema import BUILTIN_TOOLS

    mt, problems = c.rollout.multi_turn, []
    if not mt.enable:
        return problems
    for spec in mt.tools:
        if spec not in BUILTIN_TOOLS and ":" not in spec:
            problems.append(Problem("rollout.multi_turn.tools", f"unknown tool {spec!r}: use a built-in "
                                    f"({', '.join(BUILTIN_TOOLS)}) or \"file.py:name\""))
    if mt.interaction and ":" not in mt.interaction:
        problems.append(Problem("rollout.multi_turn.interaction", f"{mt.interaction!r} is not \"file.py:name\""))
    if not mt.tools and not mt.interaction:
        problems.append(Problem("rollout.multi_turn.enable", "multi-turn rollouts without tools or an interaction "
                                "stop after one turn; list tools or set an interaction", severity="warning"))
    if problems or base is None:
        return problems
    from rlctl.errors import ConfigError
    from rlctl.multiturn.interactions import load_interaction
    from rlctl.multiturn.tools import load_tools

    loaders = (("rollout.multi_turn.tools", lambda: load_tools(mt.tools, base)),
               ("rollout.multi_turn.interaction", lambda: mt.interaction and load_interaction(mt.interaction, base)))
    loaded = {}
    for key, load in loaders:
        try:
            loaded[key] = load()
        except ConfigError as e:
            message = e.message.removeprefix(key + ": ")
            problems.append(Problem(key, message + (f"; {e.hint}" if e.hint else "")))
    return problems + check_interaction_names(c, base, loaded.get("rollout.multi_turn.interaction"))


def check_interaction_names(c: Config, base: Path, interaction) -> list[Problem]:
    """Several interactions by name: every row of the data files must pick one of them
    (extra_info.interaction_kwargs.name). Files that cannot be read are check_files' to report."""
    from rlctl.multiturn.interactions import InteractionSet

    if not isinstance(interaction, InteractionSet):
        return []
    import pyarrow.parquet as pq

    problems = []
    for key in ("train_files", "val_files"):
        for p in getattr(c.data, key):
            try:
                infos = pq.read_table(_resolve(base, p), columns=["extra_info"]).column("extra_info").to_pylist()
            except Exception:
                continue
            names = [interaction.name_of(info) for info in infos]
            bad = sorted({str(n) for n in names if n not in interaction.members})
            if bad:
                count = sum(n not in interaction.members for n in names)
                problems.append(Problem(f"data.{key}", f"{p}: {count} row(s) pick no interaction of "
                                        f"rollout.multi_turn.interaction (extra_info.interaction_kwargs.name: "
                                        f"{', '.join(bad)}); it has {', '.join(interaction.members)}"))
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
        plan = dataclasses.replace(plan, train_rows=rows, steps_per_epoch=steps, total_steps=total)
    return problems, plan


def _add_rows(rows: int, path: Path) -> int | None:
    try:
        import pyarrow.parquet as pq

        return rows + pq.ParquetFile(path).metadata.num_rows
    except Exception:
        return None  # a broken file is reported by `rlctl data inspect` / at train start


def check_model(loaded: LoadedConfig) -> list[Problem]:
    """model.path is a local folder, a cached hub id, or a hub id the hub can serve now (probed fast),
    whose context holds the longest sequence (prompt + response; SFT: sft.max_length)."""
    from rlctl.errors import DataError
    from rlctl.models.hub import resolve_model

    c = loaded.config
    try:
        source = resolve_model(c.model.path, loaded.base_dir)
    except DataError as e:
        return [Problem("model.path", e.message.removeprefix("model.path ") + f"; {e.hint}")]
    problems = [Problem("model.path", source.note, severity="warning")] if source.note else []
    if source.folder is None:
        return problems  # on the hub: downloaded when training starts
    path = source.folder
    if not (path / "config.json").is_file():
        return [Problem("model.path", f"{c.model.path} has no config.json; point it at a Hugging Face model "
                                      "folder (or make one: `rlctl model tiny models/tiny`)")]
    try:
        hf = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        return [Problem("model.path", f"{path / 'config.json'} is unreadable: {e}")]
    ctx = hf.get("max_position_embeddings")
    if c.run.kind == "sft":   # the longest training sample
        key, total, what = "sft.max_length", c.sft.max_length, ""
    else:
        key, total = "data.max_response_length", c.data.max_prompt_length + c.data.max_response_length
        what = "max_prompt_length + max_response_length = "
    if isinstance(ctx, int) and total > ctx:
        problems.append(Problem(key, f"{what}{total} exceeds the model's context of {ctx} tokens"))
    return problems


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


def resolve_auto(loaded: LoadedConfig, address: str = "") -> tuple[LoadedConfig, str]:
    """resources.gpus_per_node = "auto" -> the GPUs this machine sees (0 on CPU), once at start-up,
    so the run's config.resolved.toml records what was used and resume keeps it. Returns the
    config and why "auto" became that number ("" when the value was a number)."""
    from rlctl.runtime.resource_pool import resolve_gpus_per_node

    c = loaded.config
    if c.resources.gpus_per_node != "auto":
        return loaded, ""
    n, why = resolve_gpus_per_node("auto", address or c.resources.address)
    resources = dataclasses.replace(c.resources, gpus_per_node=n)
    return dataclasses.replace(loaded, config=dataclasses.replace(c, resources=resources)), why


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def validate(loaded: LoadedConfig, *, machine: bool = True, reach_services: bool = True
             ) -> tuple[list[Problem], BatchPlan]:
    """All problems (errors and warnings) of a type-checked config, and its batch plan (with the
    machine pass, resources.gpus_per_node = "auto" is resolved here, and the plan says to what).

    `reach_services` (with `machine`): connect to the reward URLs. Training passes False: its
    reward sources connect when they start, and an unreachable one is an error there."""
    auto_problems, auto = [], ""
    if machine:
        from rlctl.errors import ConfigError

        try:
            loaded, auto = resolve_auto(loaded)
        except ConfigError as e:
            auto_problems.append(Problem("resources.gpus_per_node",
                                         f"{e.message.removeprefix('resources.gpus_per_node = ')}; {e.hint}"))
    if loaded.config.run.kind == "sft":
        from rlctl.config.validate_sft import validate_sft

        return validate_sft(loaded, machine=machine, auto_problems=auto_problems, auto=auto)
    problems, c = check_registered(loaded)
    problems += auto_problems
    if "sft" in loaded.raw:
        problems += [Problem(f"sft.{k}", "only used by run.kind = \"sft\"", severity="warning") for k in loaded.raw["sft"]]
    batch_problems, plan = check_batches(c)
    plan = dataclasses.replace(plan, gpus_per_node_resolved=auto)
    problems += batch_problems + check_algorithm(c, loaded.raw) + check_lora(c)
    problems += check_reward(c, reach=machine and reach_services)
    problems += check_multi_turn(c, loaded.base_dir if machine else None)
    if machine and c.reward.model:
        problems += check_reward_model_path(c.reward.model, loaded.base_dir)
    if machine:
        file_problems, plan = check_files(loaded, plan)
        problems += file_problems + check_model(loaded) + check_lora_targets(loaded) + check_machine(c)
        problems += check_cpu_split(c)
        problems += check_best_metric(c, _val_data_sources(loaded) if c.run.best_metric else None)
    else:
        problems += check_best_metric(c)
    # A key that failed its own check keeps its default: rules about it would mislead.
    bad_keys = {p.key for p in loaded.problems if p.severity == "error"}
    return list(loaded.problems) + [p for p in problems if p.key not in bad_keys], plan
