"""Rewards: the verl-style router `default_compute_score` and the process-pool runner."""

from rlctl.rewards.builtin import default_compute_score

__all__ = ["default_compute_score"]
