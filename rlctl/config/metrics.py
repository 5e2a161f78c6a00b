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


def validation_metric_names(data_sources=(), val_n: int = 1) -> list[str]:
    """The val/ metrics an RL validation logs: overall, then reward and accuracy per data source; with
    rollout.val_n = n > 1 samples per prompt also pass@k of the accuracy, overall and per source, for
    k = 1, 2, 4, ... n (`val/acc` itself is then mean@n, DAPO's avg@n)."""
    names = [f"val/{m}" for m in VAL_METRIC_COLUMNS] + \
        [f"val/{ds}/{m}" for ds in sorted(data_sources) for m in VAL_METRICS_PER_SOURCE]
    if val_n > 1:
        names += [f"val/{prefix}acc/pass@{k}" for prefix in ("", *(f"{ds}/" for ds in sorted(data_sources)))
                  for k in pass_ks(val_n)]
    return names


def pass_ks(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    ks = [k for k in (2**i for i in range(n.bit_length())) if k <= n]
    return ks if ks[-1] == n else ks + [n]


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of Chen et al. (2021): 1 - C(n-c, k) / C(n, k) for c right of n samples."""
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):   # C(n-c, k) / C(n, k) as a product, no big binomials
        miss *= 1.0 - k / i
    return 1.0 - miss
