"""The PPO update schedule shared by the actor and the critic: epochs x mini-batches x micro-batches.

Each rank holds its shard of the rollout batch. A mini-batch is one optimizer step; it is cut
into micro-batches whose gradients accumulate. Losses are normalised by counts of the *whole*
mini-batch over all ranks (LossNorm with dp_size = W, since FSDP averages gradients over ranks),
so W ranks take exactly the optimizer step one rank would take on the same global mini-batch.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Callable

import numpy as np
import torch

from rlctl.errors import ConfigError
from rlctl.runtime.batch import Batch
from rlctl.workers.compute.logprob import pads_rows
from rlctl.workers.compute.micro_batches import synced_plan
from rlctl.workers.compute.vision import model_inputs
from rlctl.workers.parallel import fsdp


def mini_batch_count(shard: Batch, *, world: int, sequences_per_mini: int) -> int:
    """Mini-batches in this update: batch.meta["mini_batches"] when the controller set it (the
    group then striped the rows so mini-batch k is the same on W ranks as on one), else the
    count the controller would have decided (rlctl.config.plan.mini_batch_count)."""
    from rlctl.config.plan import mini_batch_count as planned

    count = int(shard.meta["mini_batches"]) if "mini_batches" in shard.meta else \
        planned(len(shard) * world, world=world, sequences_per_mini=sequences_per_mini)
    if count < 1 or len(shard) % count:
        raise ConfigError(f"{len(shard)} rows per worker do not split into {count} equal mini-batches",
                          hint="make data.batch_size a multiple of the mini-batch size (actor/critic.mini_batch_size)")
    return count


def minibatch_norm(mini: Batch, *, horizon: int, sp: int = 1):
    """LossNorm of a mini-batch over all ranks: token and sequence counts summed by all-reduce.

    sp > 1 (the engine's sequence parallelism, rlctl.workers.parallel.ulysses): the sp ranks of a group hold
    the same rows, so the sums count each row sp times, and the data-parallel size is world / sp. The
    sp ranks' gradients sum to sp x the group's gradient (ulysses.gather_rows), so FSDP's average over
    the world is still the average over data-parallel groups."""
    from rlctl.algorithms import LossNorm

    mask = mini["response_mask"] != 0
    correct = float(mask[mini["acc"] > 0].sum()) if "acc" in mini else 0.0   # rows with acc > 0 (VAPO's NLL)
    tokens, seqs, correct = (value / sp for value in fsdp.all_reduce_sum([float(mask.sum()),
                                                                          float((mask.sum(-1) > 0).sum()), correct]))
    world = fsdp.rank_and_world()[1]
    return LossNorm(tokens=max(tokens, 1.0), seqs=max(seqs, 1.0), horizon=float(horizon), dp_size=world // sp,
                    correct_tokens=max(correct, 1.0) if "acc" in mini else None)


def run_updates(engine, shard: Batch, *, epochs: int, mini_batches: int, micro_batch_size: int,
                horizon: int, make_loss: Callable, keys: list[str], max_tokens: int = 0) -> dict[str, float]:
    """Train `engine` on `shard`; returns metrics averaged over optimizer steps and ranks.

    make_loss(norm) -> loss_fn(micro) -> (loss, metrics). Metrics named in ADDITIVE are shares
    of the mini-batch value (summed over micro-batches and ranks, / W); others are averaged.
    Under the engine's sequence parallelism (engine.sp_size > 1) the shard is the sp group's rows
    (engine.group_rows), the same on its sp ranks, whose equal metrics the average over ranks keeps.
    max_tokens > 0: micro-batches of at most that many tokens per worker (sp ranks split each
    micro-batch, so the group's hold sp x that), as many on every rank (micro_batches.synced_plan).
    """
    steps: list[dict[str, float]] = []
    sp = engine.sp_size
    for _ in range(epochs):
        for mini in shard.chunk(mini_batches, even=True):
            norm = minibatch_norm(mini, horizon=horizon, sp=sp)
            parts = _split(engine, mini, micro_batch_size, max_tokens * sp)   # sp ranks split each micro-batch
            micros = [_micro(m, engine.device, keys) for m in parts]
            out = engine.train_mini_batch(micros, make_loss(norm))
            steps.append(_step_metrics(out))
    lr = engine.lr()
    engine.end_train_step()
    metrics = _reduce_over_ranks(steps)
    metrics.update(lr=lr, optimizer_steps=float(len(steps)))
    return metrics


def _split(engine, mini: Batch, micro_batch_size: int, max_tokens: int) -> list[Batch]:
    """A mini-batch's micro-batches: micro_batch_size rows each in order, or a token budget's."""
    if not max_tokens:
        return mini.split(micro_batch_size)
    mask = mini["attention_mask"]
    groups = synced_plan(mask.sum(1), max_tokens=max_tokens, max_rows=micro_batch_size,
                         padded=pads_rows(engine.module, mask.shape[1], engine.sp))
    return [mini.select(g) for g in groups]


def _micro(rows: Batch, device, keys: list[str]) -> dict:
    """A micro-batch's tensors on the device; a vision batch's images and M-RoPE positions under
    "vision" (rlctl.workers.compute.vision.model_inputs), which the loss passes to the forward."""
    micro = rows.to_torch(device, keys=[k for k in keys if k in rows])
    vision = model_inputs(rows, device)
    if vision:
        micro["vision"] = vision
    return micro


ADDITIVE = ("loss", "pg_loss", "entropy", "kl_loss", "vf_loss", "moe_aux_loss",
            # the rollout engine's log-probs against the update's own (rlctl.controller.drift.update_drift)
            "drift_abs_sum", "drift_prob_sum", "drift_kl_sum", "drift_tokens",
            # router replay's mismatched and all (response token, MoE layer) pairs (rlctl.workers.parallel.router_replay)
            "router_mismatch_pairs", "router_pairs")
LARGEST = ("drift_abs_max",)   # the largest over micro-batches and ranks


def trainer_engine_drift_sums(log_prob: torch.Tensor, engine_log_prob: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """A micro-batch's share of the drift between a rollout engine's log-probs of its samples and
    the trainer's, both before the update (on-policy, one optimizer step: the update's own forward
    gives the trainer's, so no separate old_log_prob pass). Sums over response tokens and the
    largest difference; rlctl.controller.drift.update_drift turns them into rollout/* metrics."""
    on = mask > 0
    own, engine = log_prob.detach()[on].double(), engine_log_prob[on].double()
    diff = (own - engine).abs()
    return {"drift_abs_sum": float(diff.sum()), "drift_prob_sum": float((own.exp() - engine.exp()).abs().sum()),
            "drift_kl_sum": float((engine - own).sum()), "drift_tokens": float(on.sum()),
            "drift_abs_max": float(diff.max()) if diff.numel() else 0.0}


def _step_metrics(out: dict) -> dict[str, float]:
    """One optimizer step on this rank: additive metrics summed over micro-batches, others averaged."""
    sums: dict[str, float] = defaultdict(float)
    for micro in out["micro"]:
        for key, value in micro.items():
            sums[key] += float(value)
    count = max(1, len(out["micro"]))
    step = {k: v if k in ADDITIVE else v / count for k, v in sums.items()}
    step.update({k: max(float(m[k]) for m in out["micro"] if k in m) for k in LARGEST if k in sums})
    step.update(loss=out["loss"], grad_norm=out["grad_norm"], skipped=out["skipped"])
    return step


def _reduce_over_ranks(steps: list[dict[str, float]]) -> dict[str, float]:
    """Mean over steps of the rank mean (additive: rank sum / W = the global mini-batch value).

    grad_norm and skipped are already global (every rank has the same value)."""
    keys = sorted(steps[0]) if steps else []
    local = np.array([[s.get(k, 0.0) for k in keys] for s in steps], dtype=np.float64).mean(0) if steps else []
    world = fsdp.rank_and_world()[1]
    summed = fsdp.all_reduce_sum(list(local))
    out = {k: float(v) / world for k, v in zip(keys, summed)}
    out.update({k: fsdp.all_reduce_max(max(s[k] for s in steps)) for k in LARGEST if k in out})
    if "skipped" in out:
        out["skipped_steps"] = out.pop("skipped") * len(steps)   # mean -> count of skipped steps
    return out
