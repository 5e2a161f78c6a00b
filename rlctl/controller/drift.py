"""How far the rollout engine's log-probs of its own samples are from the trainer's (or, in a
separate rollout group, from its rank's float32 copy's): the rollout/* drift metrics, and the check
that stops a run whose engine is not generating with the pushed weights (exit 5)."""

from __future__ import annotations

import numpy as np

from rlctl.errors import NumericalError

# rollout.max_logprob_diff = 0: the limit by model.dtype, far above the kernel noise between an engine
# and the trainer on the same weights (float32 ~1e-6 per token, bf16 ~1e-3: docs/benchmarks.md) and
# far below what a missed weight push gives (tenths of a nat).
LOGPROB_DIFF_LIMITS = {"float32": 1e-3, "bfloat16": 0.05, "float16": 0.05}
# what the engine's log-probs of its samples are compared with, by drift metric (check_drift)
DRIFT_AGAINST = {"rollout/logprob_diff_mean": "trainer's", "rollout/engine_diff_mean": "rollout rank's copy's"}


def check_drift(config, step: int, metrics: dict, key: str = "rollout/logprob_diff_mean") -> None:
    """An engine with its own weights must generate with the pushed ones: its log-probs of its own
    samples may differ by kernel and dtype noise only (rollout.max_logprob_diff) from the trainer's
    (key rollout/logprob_diff_mean, on-policy) or, in a separate rollout group, from its rank's
    float32 copy's, which holds the same push (rollout/engine_diff_mean)."""
    drift = metrics.get(key, 0.0)
    limit, dtype = logprob_diff_limit(config)
    if drift > limit:
        engine, other = config.rollout.engine, DRIFT_AGAINST[key]
        raise NumericalError(f"step {step}: the {engine} engine's log-probs of its samples differ from the "
                             f"{other} by {drift:.3g} nats per token on average (max "
                             f"{metrics.get(key.replace('_mean', '_max'), drift):.3g}), over "
                             f"rollout.max_logprob_diff = {limit:g} ({dtype}): it is not generating with the "
                             "pushed weights",
                             hint="a weight push failed or was incomplete; resume from the last checkpoint, "
                                  "or raise rollout.max_logprob_diff if the engine's kernels are that noisy")


def rollout_drift(batch) -> dict:
    """How far a GPU engine's log-probs of its sampled tokens are from the trainer's (same weights,
    other kernels and dtype): a large or growing value means the engine is not generating with
    the trained weights; in one_step_off mode, how far the policy moved in one update. Means and
    max over response tokens, as log-probs and as probabilities, and the sampled KL."""
    mask = batch["response_mask"] > 0
    if not mask.any():
        return {}
    old, engine = batch["old_log_prob"][mask].astype(np.float64), batch["rollout_log_prob"][mask].astype(np.float64)
    diff = np.abs(old - engine)
    return drift_metrics(abs_sum=float(diff.sum()), abs_max=float(diff.max()),
                         prob_sum=float(np.abs(np.exp(old) - np.exp(engine)).sum()),
                         kl_sum=float((engine - old).sum()), tokens=float(diff.size))


def drift_metrics(*, abs_sum: float, abs_max: float, prob_sum: float, kl_sum: float, tokens: float) -> dict:
    """The rollout/* drift metrics from sums over `tokens` response tokens (rollout_drift's, or the
    actor update's: update_drift); `rollout/kl` is the k1 estimate of KL(rollout || trainer)."""
    return {"rollout/logprob_diff_mean": abs_sum / tokens, "rollout/logprob_diff_max": abs_max,
            "rollout/prob_diff_mean": prob_sum / tokens, "rollout/kl": kl_sum / tokens}


def update_drift(metrics: dict) -> dict:
    """rollout_drift's metrics from the sums the actor's update reported (actor/drift_*, popped from
    `metrics`): on-policy with one optimizer step the trainer's log-probs come from the update's own
    forward, before its optimizer step, instead of a separate old_log_prob pass."""
    sums = {k: metrics.pop(f"actor/drift_{k}") for k in ("abs_sum", "prob_sum", "kl_sum", "tokens", "abs_max")}
    return drift_metrics(**sums) if sums["tokens"] > 0 else {}


def logprob_diff_limit(config) -> tuple[float, str]:
    """rollout.max_logprob_diff, or its default for model.dtype ("auto": float32 on CPU, bfloat16 on
    GPUs, as rlctl.workers.parallel.fsdp.resolve_dtype); and the dtype it was chosen for. With top-p / top-k on
    there is no default (vLLM's log-probs are then of the filtered distribution, the trainer's not)."""
    dtype = config.model.dtype
    if dtype == "auto":
        dtype = "float32" if config.resources.gpus_per_node == 0 else "bfloat16"
    if config.rollout.max_logprob_diff > 0:
        return config.rollout.max_logprob_diff, dtype
    if config.rollout.top_p < 1 or config.rollout.top_k > 0:   # the engine's log-probs are of the filtered,
        return float("inf"), dtype                              # renormalised distribution: no default
    return LOGPROB_DIFF_LIMITS.get(dtype, LOGPROB_DIFF_LIMITS["bfloat16"]), dtype
