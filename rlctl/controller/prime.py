"""PRIME's step on the controller: the implicit PRM learns from the batch's outcomes and scores its
tokens (rlctl.workers.roles.prime_rm), in the order algorithm.params.prm_update says.

    "before": update_prm, then compute_rm_scores (verl's default: scores from the updated PRM)
    "after":  compute_rm_scores, then update_prm (scores from the PRM as it was before this step)
    "none":   compute_rm_scores only (a frozen PRM)

The label is the reward's `acc` (verl) or its score (prm_label = "score", which must lie in [0, 1]).
"""

from __future__ import annotations

import numpy as np

from rlctl.errors import RewardError
from rlctl.runtime.batch import Batch


def prime_params(config):
    from rlctl.algorithms import estimator_params

    return estimator_params(config.algorithm.name, config.algorithm.params)


def labels(batch: Batch, label: str) -> np.ndarray:
    """The PRM's BCE targets [B] in [0, 1]; a score outside that range stops the run in one line."""
    values = (batch["acc"] if label == "acc" else batch["scores"]).astype(np.float32)
    if label == "score" and not ((values >= 0) & (values <= 1)).all():
        bad = float(values[(values < 0) | (values > 1) | ~np.isfinite(values)][0])
        raise RewardError(f"the implicit PRM's label is the reward's score, and a score is {bad:g}, outside [0, 1]",
                          hint="set algorithm.params.prm_label = \"acc\", or return scores in [0, 1]")
    return values


def process_rewards(batch: Batch, config, prm) -> tuple[Batch, dict]:
    """`batch` (its meta holding the actor's mini-batch count) plus rm_scores [B, T]; prm/* metrics."""
    params = prime_params(config)
    batch["prm_label"] = labels(batch, params.prm_label)
    metrics: dict = {}
    if params.prm_update == "before":
        metrics.update(prm.update_prm(batch))
    batch = batch.union(prm.compute_rm_scores(batch))
    if params.prm_update == "after":
        metrics.update(prm.update_prm(batch))
    per_row = (batch["rm_scores"] * (batch["response_mask"] != 0)).sum(-1)
    metrics.update({"prm/process_reward_mean": float(per_row.mean()),
                    "prm/process_reward_std": float(per_row.std())})
    return batch, metrics
