"""The batch columns an estimator or a policy loss may read, and the pass of a run that fills each.

An algorithm declares the columns it reads (`reads=` at registration) and nothing else about its
inputs. This table says which pass produces each column, so what a run starts (a critic, a
reference model, a greedy rollout, an implicit PRM, ...) is derived from the declarations
(`registry.algorithm_needs`), and so is how `compute_advantages` checks and hands each column to
the estimator (its `form`). A column not listed is one the rollout or the data brings (a
per-prompt parquet column, a reward's extra key): read as the batch holds it, first dimension B.
"""

from __future__ import annotations

from dataclasses import dataclass

# forms: how compute_advantages checks a column and hands it to an estimator
TOKEN = "token"            # [B, T], in the compute dtype, zeroed on padding
SEQUENCE = "sequence"      # [B], in the compute dtype
FLAG = "flag"              # [B] bool
COMPONENTS = "components"  # {name: [B]} given; [K, B] of the params' reward_keys (+ reward_weights [K]) received
RAW = "raw"                # as the batch holds it, first dimension B


@dataclass(frozen=True)
class Column:
    made_by: str               # the pass that fills it; reading the column starts that pass
    form: str = RAW
    optional: bool = False     # its pass is turned on by the config, not by a reader: None when it did not run
    update: bool = False       # the actor's update takes it when the batch holds it (every policy loss may use it)


COLUMNS: dict[str, Column] = {
    # the policy's log-probs recomputed by the trainer (compute_log_prob), even when on-policy
    "old_log_prob": Column("old_log_prob", TOKEN, update=True),
    "sum_pi_squared": Column("old_log_prob", TOKEN),   # sum_v pi(v)^2 per position, from the same pass
    "ref_log_prob": Column("reference", TOKEN, update=True),   # the reference model's (compute_ref_log_prob)
    "values": Column("critic", TOKEN),                 # the critic's; reading them also trains the critic
    "reward_baselines": Column("greedy_baseline", SEQUENCE),   # the score of a greedy rollout of the prompt
    "rm_scores": Column("implicit_prm", TOKEN),        # an implicit PRM's process rewards (PRIME)
    "reward_components": Column("reward_components", COMPONENTS),   # the reward dict's named extras
    "real_response": Column("real_response", FLAG),    # rows holding the data's reference answer (SPIN)
    # algorithm.rollout_correction's IS weights: the config turns them on
    "rollout_is_weights": Column("rollout_correction", TOKEN, optional=True, update=True),
    "rollout_log_prob": Column("rollout", TOKEN, optional=True, update=True),   # the engine's, where it reports them
    "scores": Column("rollout"),                       # the reward's score [B]
    "acc": Column("rollout"),                          # the reward's accuracy [B], where it reports one
    "response_length": Column("rollout"),              # [B]
    # distill.*: the teachers' log-probs (and top-k ids and log-probs) for the distillation losses
    "teacher_log_prob": Column("teacher", TOKEN, optional=True, update=True),
    "teacher_topk_ids": Column("teacher", optional=True, update=True),
    "teacher_topk_log_prob": Column("teacher", optional=True, update=True),
    "routed_experts": Column("old_log_prob", optional=True, update=True),   # actor.router_replay's routes
}

ROLLOUT = Column("rollout")   # what an unlisted column is


def column(name: str) -> Column:
    return COLUMNS.get(name, ROLLOUT)


def passes(reads) -> frozenset[str]:
    """The passes a run must start for the columns `reads` (the optional ones start nothing)."""
    return frozenset(column(c).made_by for c in reads if not column(c).optional)


def update_columns(reads=()) -> tuple[str, ...]:
    """The columns the actor's update takes: the response, the advantages, every column the table
    marks `update` (when the batch holds it) and those the policy loss `reads`."""
    marked = tuple(name for name, c in COLUMNS.items() if c.update)
    return ("response_mask", "advantages", *marked, *(c for c in reads if c not in marked))
