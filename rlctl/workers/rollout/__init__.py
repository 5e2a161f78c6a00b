"""Rollout engines: generate responses from the policy (base.py: the interface; registry.py: name -> engine;
partial.py: generation in rounds on the async rollout ranks)."""

from rlctl.workers.rollout.base import RolloutEngine
from rlctl.workers.rollout.registry import make_rollout_engine, rollout_engine_info

__all__ = ["RolloutEngine", "make_rollout_engine", "rollout_engine_info"]
