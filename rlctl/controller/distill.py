"""On-policy distillation on the controller: route each row to its teacher, gather the teachers'
log-probs of the student's own tokens, and turn them into advantages (the k1 policy-gradient form)
or leave them in the batch for the actor's supervised loss (k3, forward_kl_topk, jsd).

    teachers = build_teachers(config, workers)          # None when [distill] names no teacher
    batch = teachers.score(batch, metrics)              # after old_log_prob: teacher_* columns + distill/*
    metrics.update(distill_advantages(batch, config))   # after the task advantages (rlctl.controller.advantage)

Routing: with one teacher every row goes to it (named "teacher" in the metrics); with
[distill.teachers] a row goes to the teacher named by its distill.teacher_key value (a data
column such as data_source, else a key of extra_info). validate rejects data whose values name no
teacher; a batch that still has one stops the run with a data error, never a silent fallback.
"""

from __future__ import annotations

import numpy as np
import torch

from rlctl.config.schema import Config
from rlctl.errors import DataError
from rlctl.runtime.batch import Batch
from rlctl.workers.roles.distill_checks import row_teacher_keys

SINGLE = "teacher"   # the name of distill.teacher (or teacher_url) in the per-teacher metrics
INPUT_KEYS = ["input_ids", "attention_mask", "response_mask"]


class Teachers:
    """The run's teachers by name (RoleHandles of TeacherWorker groups, or a TeacherClient)."""

    def __init__(self, config: Config, handles: dict):
        self.config, self.handles = config, handles
        self.routed = bool(config.distill.teachers)

    def route(self, batch: Batch) -> np.ndarray:
        """The teacher name of each row (object [B])."""
        if not self.routed:
            return np.array([SINGLE] * len(batch), dtype=object)
        key = self.config.distill.teacher_key
        names = row_teacher_keys(batch, key)
        unknown = sorted({str(n) for n in names if n not in self.handles})
        if unknown:
            raise DataError(f"distill.teacher_key = {key!r}: the value(s) {', '.join(map(repr, unknown))} of this "
                            f"batch name no teacher of [distill.teachers] ({', '.join(self.handles)})",
                            hint="add a teacher of that name to [distill.teachers], or fix the data")
        return np.array(names, dtype=object)

    def score(self, batch: Batch, metrics: dict) -> Batch:
        """The batch with the teacher_* columns added (each row scored by its teacher) and the
        distill/* metrics in `metrics`; the batch must hold old_log_prob (the student's)."""
        names = self.route(batch)
        columns: dict[str, np.ndarray] = {}
        for name, handle in self.handles.items():
            rows = np.flatnonzero(names == name)
            if len(rows):
                part = handle.compute_teacher_log_prob(batch.select(rows).select_keys(INPUT_KEYS))
                for key in part.keys():
                    columns.setdefault(key, np.zeros((len(batch), *part[key].shape[1:]), part[key].dtype))[rows] = \
                        part[key]
        out = batch.union(Batch(columns, batch.meta))
        metrics.update(teacher_metrics(out, names, list(self.handles)))
        return out


def teacher_metrics(batch: Batch, names: np.ndarray, teachers: list[str]) -> dict:
    """distill/rkl, teacher_mass, overlap over all response tokens, and distill/<name>/rkl and
    distill/<name>/token_frac (its share of the batch's response tokens) per teacher."""
    from rlctl import algorithms

    mask = torch.from_numpy(batch["response_mask"].astype(np.float32))
    tensors = {"log_prob": torch.from_numpy(batch["old_log_prob"].astype(np.float32)),
               "teacher_log_prob": torch.from_numpy(batch["teacher_log_prob"].astype(np.float32)),
               "in_teacher_topk": torch.from_numpy(batch["in_teacher_topk"])}
    out = {f"distill/{k}": v for k, v in algorithms.distill_stats(response_mask=mask, **tensors).items()}
    total = float(mask.sum()) or 1.0
    for name in teachers:
        rows = torch.from_numpy(names == name)
        tokens = float(mask[rows].sum())
        out[f"distill/{name}/token_frac"] = tokens / total
        if tokens:
            stats = algorithms.distill_stats(response_mask=mask[rows], **{k: v[rows] for k, v in tensors.items()})
            out[f"distill/{name}/rkl"] = stats["rkl"]
    return out


def distill_advantages(batch: Batch, config: Config) -> dict:
    """The k1 form: advantages = coef x -(log p_student - log p_teacher) per token, plus the task's
    advantages when distill.use_task_reward. The supervised forms leave the distillation to the
    actor's loss; without the task reward their policy loss has zero advantages."""
    from rlctl import algorithms

    d = config.distill
    task = batch["advantages"] if d.use_task_reward else np.zeros_like(batch["advantages"])
    if not algorithms.get_distill_loss(d.loss).policy_gradient:
        batch["advantages"] = task
        return {}
    adv = algorithms.distill_advantages(
        d.loss, log_prob=torch.from_numpy(batch["old_log_prob"].astype(np.float32)),
        teacher_log_prob=torch.from_numpy(batch["teacher_log_prob"].astype(np.float32)),
        response_mask=torch.from_numpy(batch["response_mask"].astype(np.float32)), coef=d.coef).numpy()
    batch["advantages"] = (task + adv).astype(np.float32)
    valid = batch["response_mask"] > 0
    return {"distill/advantages/mean": float(adv[valid].mean()) if valid.any() else 0.0}


def build_teachers(config: Config, workers) -> Teachers | None:
    """The run's teachers: the workers' teacher roles, or the teacher_url client; None when off."""
    from rlctl.config.schema import distill_enabled

    if not distill_enabled(config):
        return None
    if config.distill.teacher_url:
        from rlctl.controller.teacher_client import TeacherClient

        return Teachers(config, {SINGLE: TeacherClient(config)})
    return Teachers(config, dict(workers.teachers))
