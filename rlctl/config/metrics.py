"""The metrics a validation logs, by name: what run.best_metric may name.

Read by the trainers (which compute them) and by the best_metric check (which compares the name
against them), so the two cannot disagree. Names only: no computation lives here.
"""

from __future__ import annotations

# RL logs `val/<name>` and `val/<data_source>/<name>`: the mean of a batch column
# (rlctl.controller.trainer.validation_metrics computes them from these).
VAL_METRIC_COLUMNS = {"reward/mean": "scores", "acc": "acc", "response_length/mean": "response_length"}
VAL_METRICS_PER_SOURCE = ("reward/mean", "acc")
# SFT logs these two; both are better when lower.
SFT_VAL_METRICS = ("val/loss", "val/perplexity")


def validation_metric_names(data_sources=()) -> list[str]:
    """The val/ metrics an RL validation logs: overall, then reward and accuracy per data source."""
    return [f"val/{m}" for m in VAL_METRIC_COLUMNS] + \
        [f"val/{ds}/{m}" for ds in sorted(data_sources) for m in VAL_METRICS_PER_SOURCE]
