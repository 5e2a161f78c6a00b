"""Name -> algorithm registries that reject duplicates, and what each algorithm needs.

An advantage estimator or policy loss is a pure tensor function registered under a name together
with a declaration of what it needs (a critic, a group of samples per prompt, a greedy baseline).
The training loop and the config validator read those declarations through `algorithm_needs`,
so no code outside this package ever branches on an algorithm's name.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable

from .errors import AlgorithmError
from .params import check_params_class, make_params


@dataclass(frozen=True)
class EstimatorSpec:
    """An advantage estimator and what it needs from the rollout.

    fn is called with keyword arguments only: token_level_rewards, response_mask, group_ids,
    values, reward_baselines, gamma, lam, norm_adv_by_std, epsilon, the fields of its `params`
    dataclass (from [algorithm.params]) and the batch columns it `reads` (tensors, first dimension
    B); it returns (advantages, returns), both [B, T]. Accept **kwargs to ignore what you do not use.
    """

    name: str
    fn: Callable
    needs_critic: bool = False           # values [B, T] from a critic (and a critic to train)
    needs_group: bool = False            # group_ids; rollout.n >= 2 for a meaningful baseline
    needs_greedy_baseline: bool = False  # reward_baselines [B]: the score of a greedy rollout
    needs_reference: bool = False        # ref_log_prob [B, T] (and old_log_prob): a reference model
    needs_old_log_prob: bool = False     # old_log_prob [B, T] recomputed by the trainer, even when on-policy
    needs_sum_pi_squared: bool = False   # sum_pi_squared [B, T]: sum_v pi(v)^2 at each response position
    needs_reward_components: bool = False  # reward_components [K, B] (+ reward_weights [K]) from the reward
    needs_real_response: bool = False   # real_response [B]: rows whose response is the data's reference
                                        # answer, paired by group id with a generation (SPIN)
    params: type | None = None          # frozen dataclass of its parameters ([algorithm.params]); with
                                        # needs_reward_components it has reward_keys (and reward_weights)
    reads: tuple[str, ...] = ()         # further batch columns it reads, passed by name (e.g. "scores")
    needs_implicit_prm: bool = False    # rm_scores [B, T] from an implicit PRM trained online (PRIME)

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


@dataclass(frozen=True)
class PolicyLossSpec:
    """A policy loss and what it declares about the actor settings it reads.

    loss_agg_mode set means the loss always aggregates that way (GSPO). The declarations are plain
    data, read by the config checks (rlctl.workers.loss_checks) so no rule compares a loss's name;
    a loss that declares nothing gets no rule about them."""

    name: str
    fn: Callable
    loss_agg_mode: str | None = None
    clip_higher: bool = False           # clips the ratio to [1 - clip_ratio_low, 1 + clip_ratio_high] (DAPO)
    bypass_loss: bool = False           # is the loss bypass_mode's "ppo_clip" uses, so bypass replaces nothing
    required: tuple[RequiredParam, ...] = ()
    trust_region: bool = False          # bounds how far an update moves from old_log_prob (clip, penalty):
                                        # what rollout.max_staleness > 1 needs (rlctl.workers.loss_checks)
    corrects_rollout: bool = False      # weights tokens by pi_old / pi_rollout itself (reads rollout_log_prob):
                                        # rollout correction's IS weights are not applied on top
    params: type | None = None          # frozen dataclass of its parameters ([actor.loss_params])
    reads: tuple[str, ...] = ()         # further batch columns [B, T] it reads, passed by name per micro-batch


@dataclass(frozen=True)
class Needs:
    """What a training run must set up, derived from declarations and the KL settings."""

    critic: bool
    reference: bool
    greedy_baseline: bool
    min_group_size: int
    old_log_prob: bool = False       # the trainer must recompute old_log_prob (see EstimatorSpec)
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


def register_estimator(name: str, *, needs_critic: bool = False, needs_group: bool = False,
                       needs_greedy_baseline: bool = False,
                       needs_reference: bool = False, needs_old_log_prob: bool = False,
                       needs_sum_pi_squared: bool = False,
                       needs_reward_components: bool = False,
                       needs_real_response: bool = False, params: type | None = None,
                       reads: tuple[str, ...] = (), needs_implicit_prm: bool = False) -> Callable[[Callable], Callable]:
    """Decorator: register an advantage estimator under `name`; a taken name is an error.
    params: a frozen dataclass of its parameters (every field with a default); reads: batch columns."""
    _check_new("advantage estimator", name, _ESTIMATORS)
    check_params_class(f"advantage estimator {name!r}", params)
    if needs_reward_components and not {"reward_keys", "reward_weights"} <= set(getattr(params, "__dataclass_fields__", ())):
        raise AlgorithmError(f"advantage estimator {name!r} declares needs_reward_components: its params need the "
                             "fields reward_keys (tuple[str, ...]) and reward_weights (tuple[float, ...])")

    def decorator(fn: Callable) -> Callable:
        _check_new("advantage estimator", name, _ESTIMATORS)
        _ESTIMATORS[name] = EstimatorSpec(name, fn, needs_critic, needs_group, needs_greedy_baseline,
                                          needs_reference, needs_old_log_prob, needs_sum_pi_squared,
                                          needs_reward_components, needs_real_response, params, tuple(reads),
                                          needs_implicit_prm)
        return fn

    return decorator


def register_policy_loss(name: str, *, loss_agg_mode: str | None = None, clip_higher: bool = False,
                         bypass_loss: bool = False, required: tuple[RequiredParam, ...] = (),
                         trust_region: bool = False, corrects_rollout: bool = False, params: type | None = None,
                         reads: tuple[str, ...] = ()) -> Callable[[Callable], Callable]:
    """Decorator: register a policy loss under `name`; a taken name is an error.

    fn is called with keyword arguments only: old_log_prob, log_prob, advantages, response_mask,
    clip_ratio_low, clip_ratio_high, clip_ratio_c, loss_agg_mode, norm, the fields of its `params`
    dataclass (from [actor.loss_params]) and the batch columns it `reads`; it returns
    (loss: scalar tensor, metrics: dict[str, float]). The keywords after loss_agg_mode declare
    what `rlctl config validate` checks for it (see PolicyLossSpec).
    """
    _check_new("policy loss", name, _POLICY_LOSSES)
    check_params_class(f"policy loss {name!r}", params)
    for param in required:
        if params is None or param.key not in {f for f in params.__dataclass_fields__}:
            raise AlgorithmError(f"policy loss {name!r}: required parameter {param.key!r} is not a field of its params")

    def decorator(fn: Callable) -> Callable:
        _check_new("policy loss", name, _POLICY_LOSSES)
        _POLICY_LOSSES[name] = PolicyLossSpec(name, fn, loss_agg_mode, clip_higher, bypass_loss, tuple(required),
                                              trust_region, corrects_rollout, params, tuple(reads))
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


def algorithm_needs(estimator: str, *, kl_in_reward: bool, use_kl_loss: bool) -> Needs:
    """What to build for a run: the estimator's declaration plus the KL settings.

    The reference model is needed when a KL term is computed (in the reward or as a loss) or when
    the estimator declares it reads reference log-probs itself.
    """
    spec = get_estimator(estimator)
    return Needs(critic=spec.needs_critic, reference=bool(kl_in_reward or use_kl_loss or spec.needs_reference),
                 greedy_baseline=spec.needs_greedy_baseline, min_group_size=spec.min_group_size,
                 old_log_prob=spec.needs_old_log_prob or spec.needs_sum_pi_squared,
                 sum_pi_squared=spec.needs_sum_pi_squared, reward_components=spec.needs_reward_components,
                 real_response=spec.needs_real_response, implicit_prm=spec.needs_implicit_prm)


def estimator_params(name: str, values=None):
    """The estimator's params dataclass instance for the [algorithm.params] table `values` (None when it
    declares none); AlgorithmError listing every problem."""
    return make_params(f"advantage estimator {name!r}", get_estimator(name).params, values)


def loss_params(name: str, values=None):
    """The policy loss's params dataclass instance for the [actor.loss_params] table `values`."""
    return make_params(f"policy loss {name!r}", get_policy_loss(name).params, values)
