"""The rollout table: every way a batch is generated, and what each is built with.

    kind = kind_of(config)                      # the row the run's config selects ("single" when none)
    rollout = kind.rollout_class()(turns, ctx)  # rlctl.rollouts.base.build_rollout

A kind is its `Rollout` class (rlctl.rollouts.base: generate a batch through the policy's turn
generator, score it) plus one row here declaring what it supports. The checks that refuse a
combination (rlctl.rollouts.checks) and the rollout modes read these declarations, never a kind's
name. An environment library is one `Environment` row: the data_source its task writes, the built-in
agent that plays those rows, and what the rows carry (`ground_truth`).

This module imports nothing heavy: validation reads it without starting anything.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from rlctl.config.schema import SEPARATE_ROLLOUT_MODES

if TYPE_CHECKING:
    from rlctl.config.schema import Config

ALL_MODES = ("sync", *SEPARATE_ROLLOUT_MODES)


def _never(config: Config) -> bool:
    return False


@dataclass(frozen=True)
class RolloutKind:
    """One row: a kind of rollout and what it is built with."""

    name: str
    rollout: str                            # "module:Class" of its Rollout, imported when a run builds it
    title: str                              # what it is, in a problem's words ("agent programs")
    key: str                                # the config key that turns it on ("" for the default kind)
    selected: Callable[[Config], bool]      # the config turns it on
    modes: tuple[str, ...] = ALL_MODES      # rollout.mode values it is built for
    one_call: bool = True                   # a batch is one `generate` call on the group, queued in order with
    #                                         weight pushes; else the rollout drives the group turn by turn
    #                                         from the controller's process (one_step_off / async run it in a thread)
    partial: bool = True                    # rollout.partial_rollout: generation in rounds
    round_of: str = "tokens"                # what one partial round is: rollout.partial_chunk "tokens" or a "turn"
    image_modes: tuple[str, ...] = ALL_MODES   # a vision-language policy: the modes it carries images in (none: ())
    image_engines: tuple[str, ...] = ()     # ... and the engines (() any that the engine checks allow)
    greedy_baseline: bool = True            # a greedy rollout per prompt (ReMax's baseline)
    reference_pairs: bool = True            # each row one generated answer, paired with the data's reference (SPIN)
    implicit_prm: bool = True               # PRIME's implicit PRM (it reads the response tokens the mask marks the model's)
    resampled_groups: bool = True           # PF-PPO resamples a group's rows (one row a sample)
    own_reward: Callable[[Config], bool] = _never   # it brings its own reward: no reward function scores the rows

    def rollout_class(self) -> type:
        module, _, name = self.rollout.partition(":")
        return getattr(importlib.import_module(module), name)


def _tools_on(c: Config) -> bool:
    return c.rollout.multi_turn.enable


def _agent_on(c: Config) -> bool:
    return bool(c.rollout.agent.function or c.rollout.agent.command)


def _agent_reward(c: Config) -> bool:
    return c.rollout.agent.reward == "agent"


KINDS: tuple[RolloutKind, ...] = (
    RolloutKind("single", "rlctl.rollouts.single:SingleTurn", "single-turn generation", "", lambda c: True),
    RolloutKind("tools", "rlctl.multiturn.rollout:ToolLoop", "multi-turn rollouts", "rollout.multi_turn.enable",
                _tools_on, one_call=False, round_of="turn", image_modes=("sync",), image_engines=("hf",),
                reference_pairs=False),
    RolloutKind("agent", "rlctl.agent.rollout:AgentPrograms", "agent programs", "rollout.agent.function",
                _agent_on, modes=("sync",), one_call=False, partial=False, image_modes=(), greedy_baseline=False,
                reference_pairs=False, resampled_groups=False, own_reward=_agent_reward),
)


def selected_kinds(config: Config) -> list[RolloutKind]:
    """Every row the config turns on, the default kind first (several besides it: a problem)."""
    return [kind for kind in KINDS if kind.selected(config)]


def kind_of(config: Config) -> RolloutKind:
    """The run's kind: the last row its config turns on (an agent over rlctl's tool loop)."""
    return selected_kinds(config)[-1]


@dataclass(frozen=True)
class Environment:
    """An environment library: a task writes its rows, a built-in agent plays them."""

    name: str             # `rlctl data prep NAME:ID` (its task in rlctl.tasks)
    source_prefix: str    # the data_source of every row its task writes starts with this
    agent: str            # the rollout.agent.function name of the built-in agent that plays (and rewards) the rows
    player: str           # "module:function" returning that agent's async (client, row, *, tokenizer) function
    #                       (UsageError when the library is not installed)
    ground_truth: bool    # the rows carry a ground truth (else the environment holds the answer)
    own_template: bool    # the agent renders its prompts itself (model.chat_template does not reach it)

    def agent_function(self):
        module, _, name = self.player.partition(":")
        return getattr(importlib.import_module(module), name)()


ENVIRONMENTS: tuple[Environment, ...] = (
    Environment("verifiers", "verifiers/", agent="verifiers", player="rlctl.agent.verifiers_agent:player",
                ground_truth=False, own_template=True),
)


def environment_of(data_source: str) -> Environment | None:
    """The environment library whose task wrote a row of this data_source (None: a plain task's)."""
    return next((env for env in ENVIRONMENTS if str(data_source).startswith(env.source_prefix)), None)


def builtin_agent(function: str) -> Environment | None:
    """The environment library whose built-in agent rollout.agent.function names (None: a user's agent)."""
    return next((env for env in ENVIRONMENTS if function and env.agent == function), None)
