"""Config checks of the keys the training controller reads: the algorithm, the batch sizes, KL,
loggers and the best-checkpoint metric.

Not in rlctl.algorithms, which stays torch/numpy/stdlib only, nor in rlctl.controller, which runs
these checks before a run starts (rlctl.validate) and so cannot be imported by them. What they
know of an estimator they read from its registry declaration (EstimatorSpec), never from its name.
Each is `check(config, ctx)` (rlctl.config.checks) except the two that also return something to
check further with.
"""

from __future__ import annotations

import dataclasses
import importlib.util

from rlctl.config.checks import CheckContext
from rlctl.config.loader import Problem, suggest
from rlctl.config.metrics import SFT_VAL_METRICS, validation_metric_names
from rlctl.config.plan import BatchPlan, batch_plan, step_plan, world_size
from rlctl.config.schema import SEPARATE_ROLLOUT_MODES, Config


def problems_at(problems: list[Problem], table: str) -> bool:
    return any(p.key == table or p.key.startswith(table + ".") for p in problems)


def estimator_params_of(c: Config):
    """The estimator's params instance (None when it declares none); the config must be valid."""
    from rlctl.algorithms import estimator_params

    return estimator_params(c.algorithm.name, c.algorithm.params)


def check_registered(config: Config, ctx: CheckContext) -> tuple[list[Problem], Config]:
    """Import algorithm.plugins, then check algorithm.name and actor.policy_loss against the
    registries. Returns the problems and the config to check further: an unknown name is
    replaced by its default there, so that rules about it do not mislead."""
    from rlctl.algorithms import estimator_names, policy_loss_names
    from rlctl.errors import ConfigError
    from rlctl.plugins import import_plugins

    c, problems = config, []
    try:
        import_plugins(c.algorithm.plugins, ctx.base_dir)
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
    """Each training role's mini- and micro-batches divide the step's batch over its workers."""
    from rlctl.algorithms import run_needs

    problems = []
    separate = c.rollout.mode in SEPARATE_ROLLOUT_MODES
    n, workers = c.rollout.n, world_size(c.resources, separate)
    over = (f"resources.workers = {workers}" if workers == c.resources.workers
            else f"the {workers} GPU workers (" + ("gpus_per_node - rollout_workers)" if separate
                                                  else "resources.nodes x gpus_per_node)"))
    roles = ("actor", "critic") if run_needs(c).critic else ("actor",)
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
        per_worker, budget = seqs // workers, sect.micro_batch_max_tokens
        longest = c.data.max_prompt_length + c.data.max_response_length
        if budget and budget < longest:
            problems.append(Problem(f"{role}.micro_batch_max_tokens",
                                    f"{budget} is below data.max_prompt_length + max_response_length = {longest}: a "
                                    "row that long runs alone, over the budget", severity="warning"))
        if not budget and per_worker % sect.micro_batch_size:   # a token budget cuts by tokens instead
            problems.append(Problem(f"{role}.micro_batch_size",
                                    f"{sect.micro_batch_size} does not divide the {per_worker} sequences each worker "
                                    f"gets per optimizer step ({mini} prompts x n {n} / {workers} workers)"))
    return problems, step_plan(c)


def check_algorithm(c: Config, ctx: CheckContext) -> list[Problem]:
    """What the estimator declares it needs (groups, reward components, a critic), and the
    algorithm keys that only make sense together."""
    from rlctl.algorithms import get_estimator, run_needs

    problems, spec, needs = [], get_estimator(c.algorithm.name), run_needs(c)
    if spec.needs_group and c.rollout.n < 2:
        problems.append(Problem("rollout.n", f"algorithm {c.algorithm.name!r} compares samples within a group of "
                                             f"the same prompt and needs rollout.n >= 2 (got {c.rollout.n})"))
    from rlctl.workers.roles.loss_checks import params_problems_of

    problems += params_problems_of("algorithm.params", f"algorithm {c.algorithm.name!r}", spec, c.algorithm.params)
    if needs.reward_components and not problems_at(problems, "algorithm.params") and \
            not estimator_params_of(c).reward_keys:
        problems.append(Problem("algorithm.params.reward_keys", f"algorithm {c.algorithm.name!r} normalises each "
                                "reward component on its own: list the keys your reward function returns in its "
                                "dict, e.g. reward_keys = [\"format\", \"accuracy\"]"))
    rc = c.algorithm.rollout_correction
    if rc.rollout_rs:
        from rlctl.algorithms import AlgorithmError
        from rlctl.algorithms.rollout_correction import parse_rollout_rs

        try:
            parse_rollout_rs(rc.rollout_rs, rc.rollout_rs_threshold)
        except AlgorithmError as err:
            problems.append(Problem("algorithm.rollout_correction.rollout_rs", str(err)))
    if needs.critic and "critic" not in ctx.raw:
        problems.append(Problem("critic", f"algorithm {c.algorithm.name!r} trains a value model: add a [critic] "
                                          "section (e.g. lr = 1e-5)"))
    if not needs.critic and "critic" in ctx.raw:
        problems.append(Problem("critic", f"[critic] is unused by algorithm {c.algorithm.name!r} and is ignored",
                                severity="warning"))
    if c.rollout.temperature == 0 and c.rollout.n > 1:
        problems.append(Problem("rollout.temperature", "0 (greedy) makes all rollout.n samples identical, so "
                                                        "group advantages are zero", severity="warning"))
    return problems


def check_kl(c: Config, ctx: CheckContext) -> list[Problem]:
    if c.actor.use_kl_loss and c.algorithm.kl_in_reward:
        return [Problem("actor.use_kl_loss", "KL is both in the reward (algorithm.kl_in_reward) and in the "
                                             "loss; usually you want one of them", severity="warning")]
    return []


def check_loggers(c: Config, ctx: CheckContext) -> list[Problem]:
    """run.loggers that need an optional package (the machine pass)."""
    problems = []
    for logger, pkg in (("tensorboard", "tensorboard"), ("wandb", "wandb")):
        if logger in c.run.loggers and importlib.util.find_spec(pkg) is None:
            problems.append(Problem("run.loggers", f"{logger!r} is configured but not installed; "
                                                   f"pip install \"rlctl[{logger}]\""))
    return problems


def check_best_metric(c: Config, ctx: CheckContext) -> list[Problem]:
    """RL: run.best_metric names a metric validation logs; ctx.val_data_sources (None when
    unread) decide the per-source names."""
    return best_metric_problems(c, ctx.val_data_sources)


def check_sft_best_metric(c: Config, ctx: CheckContext) -> list[Problem]:
    """RL's rule against SFT's metrics (val_every = 0 warns alike), and both are better when lower."""
    metric, problems = c.run.best_metric, best_metric_problems(c, known=SFT_VAL_METRICS)
    if metric in SFT_VAL_METRICS and c.data.val_files and c.run.best_mode != "min":
        problems.append(Problem("run.best_mode", f"{metric} is better when lower: set run.best_mode = \"min\"",
                                severity="warning"))
    return problems


def best_metric_problems(c: Config, data_sources=None, known=None) -> list[Problem]:
    """run.best_metric must be a metric validation logs: one of `known` (SFT's), or of RL's, where
    data_sources (those of data.val_files, or None when unread) decide the per-source names."""
    metric = c.run.best_metric
    if not metric:
        return []
    if not c.data.val_files:
        return [Problem("run.best_metric", f"{metric!r} is a validation metric but the run does not validate; "
                                           "set data.val_files (and run.val_every), or run.best_metric = \"\"")]
    rl = known is None
    known = validation_metric_names(data_sources or (), c.rollout.val_n) if rl else list(known)
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


def check_pf_ppo(c: Config, ctx: CheckContext) -> list[Problem]:
    """PF-PPO filters each prompt's samples against each other (rlctl.algorithms.pf_ppo): refuse the
    settings under which it would change nothing, or break what the estimator pairs up."""
    from rlctl.algorithms import run_needs

    algo, n = c.algorithm, c.rollout.n
    if not algo.use_pf_ppo:
        written = (ctx.raw.get("algorithm") or {}).get("pf_ppo")
        return [Problem("algorithm.pf_ppo", "is set but algorithm.use_pf_ppo = false, so it does nothing: set "
                                            "use_pf_ppo = true or remove it", severity="warning")] if written else []
    if n < 2:
        return [Problem("algorithm.use_pf_ppo", f"filters each prompt's samples by their scores, and rollout.n = {n} "
                                                "gives each prompt one: nothing would be filtered. Set rollout.n >= 2")]
    if algo.pf_ppo.reweight_method == "max_min" and n == 2:
        return [Problem("algorithm.pf_ppo.reweight_method", "\"max_min\" keeps each prompt's best and worst sample, "
                        "which with rollout.n = 2 are both: nothing would be filtered. Use rollout.n >= 3 or "
                        "reweight_method = \"pow\" / \"max_random\"")]
    if run_needs(c).real_response:
        return [Problem("algorithm.use_pf_ppo", f"resamples rows, which would break the reference/generation pairs "
                        f"algorithm {algo.name!r} trains on: turn it off")]
    return []


def check_dynamic_sampling(c: Config, ctx: CheckContext) -> list[Problem]:
    """Dynamic sampling filters whole groups (rlctl.algorithms.filter_groups): a group to judge, and
    an accuracy band that is a band of the reward's acc."""
    ds, key = c.algorithm.dynamic_sampling, "algorithm.dynamic_sampling"
    if not ds.enable:
        return [Problem(f"{key}.{name}", f"filters only with {key}.enable = true, which is off, so it does nothing: "
                                         "set enable = true or remove it", severity="warning")
                for name in ("filter_accuracy", "filter_truncate") if getattr(ds, name)]
    problems = []
    if c.rollout.n < 2:
        problems.append(Problem(f"{key}.enable", "dynamic sampling keeps groups by how their samples score, so it "
                                                 "needs rollout.n >= 2"))
    if ds.filter_accuracy and ds.metric != "acc":
        problems.append(Problem(f"{key}.metric", "filter_accuracy keeps groups by their mean accuracy, the reward's "
                                                 "acc, but metric = \"score\": set metric = \"acc\""))
    if ds.filter_accuracy and ds.accuracy_lower_bound > ds.accuracy_upper_bound:
        problems.append(Problem(f"{key}.accuracy_lower_bound",
                                f"{ds.accuracy_lower_bound} is above accuracy_upper_bound = {ds.accuracy_upper_bound}, "
                                "so no group would be kept: set 0 <= accuracy_lower_bound <= accuracy_upper_bound "
                                "<= 1 (e.g. 0.2 and 0.8)"))
    return problems


def check_critic_pretrain(c: Config, ctx: CheckContext) -> list[Problem]:
    """critic.pretrain_steps needs a critic to pretrain; at total_steps or beyond the actor never trains."""
    from rlctl.algorithms import run_needs

    steps = c.critic.pretrain_steps
    if steps and not run_needs(c).critic:
        return [Problem("critic.pretrain_steps", f"algorithm {c.algorithm.name!r} trains no critic, so its "
                                                 f"{steps} value-pretraining steps would only hold the actor still: "
                                                 "set it to 0, or use a critic's estimator (gae, vapo)")]
    if steps and c.run.total_steps and steps >= c.run.total_steps:
        return [Problem("critic.pretrain_steps", f"{steps} >= run.total_steps = {c.run.total_steps}: the actor "
                                                 "never trains", severity="warning")]
    return []
