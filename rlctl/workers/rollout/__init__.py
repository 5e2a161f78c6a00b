"""Rollout engines: generate responses from the policy (see base.py for the interface)."""

from rlctl.workers.rollout.base import RolloutEngine, make_rollout_engine

__all__ = ["RolloutEngine", "make_rollout_engine"]
