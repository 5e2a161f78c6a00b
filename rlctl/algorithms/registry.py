"""Name -> algorithm registries that reject duplicates, and what each algorithm needs.

An advantage estimator or policy loss is a pure tensor function registered under a name together
with the batch columns it reads (rlctl.algorithms.columns maps each to the pass that fills it) and,
for an estimator, whether it compares a prompt's samples. The training loop and the config
validator read what follows from those declarations through `algorithm_needs`, so no code outside
this package ever branches on an algorithm's name.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable

from .columns import passes
from .errors import AlgorithmError
from .params import check_params_class, make_params


@dataclass(frozen=True, kw_only=True)
class EstimatorSpec:
    """An advantage estimator and what it reads from the rollout.

    fn is called with keyword arguments only: token_level_rewards, response_mask, group_ids,
    values, reward_baselines (None unless given or read), gamma, lam, norm_adv_by_std, epsilon, the
    fields of its `params` dataclass (from [algorithm.params]) and the batch columns it `reads`
    (rlctl.algorithms.columns: which pass fills each, and in what form it arrives); it returns
    (advantages, returns), both [B, T]. Accept **kwargs to ignore what you do not use.
    """

    name: str
    fn: Callable
    reads: tuple[str, ...] = ()   # batch columns, by name: "values" (a critic), "ref_log_prob", "rm_scores", ...
    needs_group: bool = False     # compares the samples of a prompt: rollout.n >= 2
    params: type | None = None    # frozen dataclass of its parameters ([algorithm.params]); reading
                                  # reward_components, it has reward_keys (and reward_weights)

    @property
    def min_group_size(self) -> int:
        return 2 if self.needs_group else 1


@dataclass(frozen=True)
class RequiredParam:
    """A parameter of a policy loss (a field of its params) with no usable default: it must be set > 0
    in [actor.loss_params]. `why` completes "policy_loss = "<name>" <why>, which has no default"; `example` is a value."""

    key: str
    why: str
    example: float


@dataclass(frozen=True, kw_only=True)
class PolicyLossSpec:
    """A policy loss and what it declares about the actor settings it reads.

    loss_agg_mode set means the loss always aggregates that way (GSPO). The declarations are plain
    data, read by the config checks (rlctl.workers.roles.loss_checks) so no rule compares a loss's name;
    a loss that declares nothing gets no rule about them."""

    name: str
    fn: Callable
    loss_agg_mode: str | None = None
    clip_higher: bool = False           # clips the ratio to [1 - clip_ratio_low, 1 + clip_ratio_high] (DAPO)
    bypass_loss: bool = False           # is the loss bypass_mode's "ppo_clip" uses, so bypass replaces nothing
    required: tuple[RequiredParam, ...] = ()
    trust_region: bool = False          # bounds how far an update moves from old_log_prob (clip, penalty):
                                        # what rollout.max_staleness > 1 needs (rlctl.workers.roles.loss_checks)
    corrects_rollout: bool = False      # weights tokens by pi_old / pi_rollout itself (reads rollout_log_prob):
                                        # rollout correction's IS weights are not applied on top
    params: type | None = None          # frozen dataclass of its parameters ([actor.loss_params])
    reads: tuple[str, ...] = ()         # further batch columns it reads, passed by name per micro-batch
    open_low: bool = False              # clip_ratio_low >= 1 is meaningful: 1 - low <= 0 leaves the ratio no
                                        # lower bound (CISPO only weights by it; verl's examples use low = 10)


@dataclass(frozen=True)
class Needs:
    """What a training run must set up: the passes that fill the columns its estimator and policy
    loss read (rlctl.algorithms.columns), and the KL settings."""

    critic: bool
    reference: bool
    greedy_baseline: bool
    min_group_size: int
    old_log_prob: bool = False       # the trainer must recompute old_log_prob, even when on-policy
    sum_pi_squared: bool = False     # compute_log_prob must also return sum_pi_squared
    reward_components: bool = False  # the reward's named extras go to the estimator
    real_response: bool = False      # the data's reference answers join the batch beside the generations
    implicit_prm: bool = False       # an implicit PRM worker group scores (and learns from) each batch


_ESTIMATORS: dict[str, EstimatorSpec] = {}
_POLICY_LOSSES: dict[str, PolicyLossSpec] = {}


def _check_new(kind: str, name: str, table: dict) -> None:
    if not isinstance(name, str) or not name:
        raise AlgorithmError(f"{kind} name must be a non-empty string, got {name!r}")
    if name in table:
        raise AlgorithmError(f"{kind} {name!r} is already registered (by {table[name].fn.__module__}); "
                             f"pick another name")


def _lookup(kind: str, name: str, table: dict):
    if name in table:
        return table[name]
    close = difflib.get_close_matches(str(name), list(table), n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    raise AlgorithmError(f"unknown {kind} {name!r}: {hint}known: {', '.join(sorted(table))}")


def register_estimator(name: str, *, reads: tuple[str, ...] = (), needs_group: bool = False,
                       params: type | None = None, **flags) -> Callable[[Callable], Callable]:
    """Decorator: register an advantage estimator under `name`; a taken name is an error.
    reads: the batch columns it reads (rlctl.algorithms.columns); needs_group: it compares a prompt's
    samples; params: a frozen dataclass of its parameters (every field with a default)."""
    _check_new("advantage estimator", name, _ESTIMATORS)
    if flags:   # the needs_* flags of before: a column says it now
        raise AlgorithmError(f"advantage estimator {name!r}: {', '.join(sorted(flags))} is not a declaration; declare "
                             "the batch columns it reads, e.g. reads=(\"values\",) for a critic's "
                             "(rlctl.algorithms.COLUMNS lists them and the passes that fill them)")
    reads = _check_reads(f"advantage estimator {name!r}", reads)
    check_params_class(f"advantage estimator {name!r}", params)
    if "reward_components" in reads and \
            not {"reward_keys", "reward_weights"} <= set(getattr(params, "__dataclass_fields__", ())):
        raise AlgorithmError(f"advantage estimator {name!r} reads reward_components: its params need the fields "
                             "reward_keys (tuple[str, ...]) and reward_weights (tuple[float, ...])")

    def decorator(fn: Callable) -> Callable:
        _check_new("advantage estimator", name, _ESTIMATORS)
        _ESTIMATORS[name] = EstimatorSpec(name=name, fn=fn, reads=reads, needs_group=needs_group, params=params)
        return fn

    return decorator


def _check_reads(owner: str, reads) -> tuple[str, ...]:
    if isinstance(reads, str) or not all(isinstance(c, str) and c for c in reads):
        raise AlgorithmError(f"{owner}: reads must be a tuple of column names, got {reads!r}")
    return tuple(reads)


def register_policy_loss(name: str, *, loss_agg_mode: str | None = None, clip_higher: bool = False,
                         bypass_loss: bool = False, required: tuple[RequiredParam, ...] = (),
                         trust_region: bool = False, corrects_rollout: bool = False, params: type | None = None,
                         reads: tuple[str, ...] = (), open_low: bool = False) -> Callable[[Callable], Callable]:
    """Decorator: register a policy loss under `name`; a taken name is an error.

    fn is called with keyword arguments only: old_log_prob, log_prob, advantages, response_mask,
    clip_ratio_low, clip_ratio_high, clip_ratio_c, loss_agg_mode, norm, the fields of its `params`
    dataclass (from [actor.loss_params]) and the batch columns it `reads`; it returns
    (loss: scalar tensor, metrics: dict[str, float]). The keywords after loss_agg_mode declare
    what `rlctl config validate` checks for it (see PolicyLossSpec).
    """
    _check_new("policy loss", name, _POLICY_LOSSES)
    reads = _check_reads(f"policy loss {name!r}", reads)
    check_params_class(f"policy loss {name!r}", params)
    for param in required:
        if params is None or param.key not in {f for f in params.__dataclass_fields__}:
            raise AlgorithmError(f"policy loss {name!r}: required parameter {param.key!r} is not a field of its params")

    def decorator(fn: Callable) -> Callable:
        _check_new("policy loss", name, _POLICY_LOSSES)
        _POLICY_LOSSES[name] = PolicyLossSpec(name=name, fn=fn, loss_agg_mode=loss_agg_mode, clip_higher=clip_higher,
                                              bypass_loss=bypass_loss, required=tuple(required),
                                              trust_region=trust_region, corrects_rollout=corrects_rollout,
                                              params=params, reads=reads, open_low=open_low)
        return fn

    return decorator


def get_estimator(name: str) -> EstimatorSpec:
    return _lookup("advantage estimator", name, _ESTIMATORS)


def get_policy_loss(name: str) -> PolicyLossSpec:
    return _lookup("policy loss", name, _POLICY_LOSSES)


def estimator_names() -> tuple[str, ...]:
    return tuple(_ESTIMATORS)


def policy_loss_names() -> tuple[str, ...]:
    return tuple(_POLICY_LOSSES)


def algorithm_needs(estimator: str, *, kl_in_reward: bool = False, use_kl_loss: bool = False,
                    policy_loss: str | None = None) -> Needs:
    """What to build for a run: the passes that fill the columns the estimator (and the policy loss,
    when named) read, plus the KL settings, which read the reference model's log-probs."""
    spec = get_estimator(estimator)
    reads = (*spec.reads, *(get_policy_loss(policy_loss).reads if policy_loss is not None else ()))
    made = passes(reads)
    return Needs(critic="critic" in made, reference=bool(kl_in_reward or use_kl_loss or "reference" in made),
                 greedy_baseline="greedy_baseline" in made, min_group_size=spec.min_group_size,
                 old_log_prob="old_log_prob" in made, sum_pi_squared="sum_pi_squared" in reads,
                 reward_components="reward_components" in made, real_response="real_response" in made,
                 implicit_prm="implicit_prm" in made)


def run_needs(config) -> Needs:
    """The run's needs, the one way every part of rlctl asks (the controller computes them once per
    run and hands them to the roles): the columns its estimator and its policy loss read, plugins'
    included (import them first), and its KL settings. `config`: an rlctl Config (duck-typed here,
    so this package imports nothing of rlctl's)."""
    algo, actor = config.algorithm, config.actor
    return algorithm_needs(algo.name, kl_in_reward=algo.kl_in_reward, use_kl_loss=actor.use_kl_loss,
                           policy_loss=actor.policy_loss)


def estimator_params(name: str, values=None):
    """The estimator's params dataclass instance for the [algorithm.params] table `values` (None when it
    declares none); AlgorithmError listing every problem."""
    return make_params(f"advantage estimator {name!r}", get_estimator(name).params, values)


def loss_params(name: str, values=None):
    """The policy loss's params dataclass instance for the [actor.loss_params] table `values`."""
    return make_params(f"policy loss {name!r}", get_policy_loss(name).params, values)
