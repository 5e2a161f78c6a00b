"""Rollout engines: generate responses from the policy (base.py: the interface; registry.py: name -> engine)."""

from rlctl.workers.rollout.base import RolloutEngine
from rlctl.workers.rollout.registry import make_rollout_engine, rollout_engine_info

__all__ = ["RolloutEngine", "make_rollout_engine", "rollout_engine_info"]
