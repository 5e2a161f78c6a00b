"""`TeacherWorker`: a frozen teacher model scoring the student's own sampled tokens (distill.*).

Like the reference model, but another model: it reads the student's token ids unchanged (the two
share a tokenizer; validate checks it) and is scored at temperature 1, whatever the rollout's.

Batch keys:  compute_teacher_log_prob  in:  input_ids, attention_mask [B, P+T], response_mask [B, T]
                                       out: teacher_log_prob [B, T] (the sampled tokens),
                                            teacher_topk_ids [B, T, K], teacher_topk_log_prob [B, T, K]
                                            (the teacher's K most likely next tokens, K = distill.topk),
                                            in_teacher_topk [B, T] (the sampled token is one of them)
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from rlctl.runtime import Batch, Dispatch, register
from rlctl.workers import fsdp
from rlctl.workers.logprob import batched_response_outputs, response_logits, scatter_rows
from rlctl.workers.models import load_causal_lm


class TeacherWorker:
    """Inference only: the teacher loaded whole on every rank, never trained."""

    def __init__(self, config, *, path: str):
        model_cfg = dataclasses.replace(config.model, path=path)
        self.model = load_causal_lm(model_cfg, fsdp.resolve_dtype(config.model.dtype))
        self.device = fsdp.device()
        self.model = self.model.to(self.device).eval().requires_grad_(False)
        self.topk = min(config.distill.topk, self.model.config.vocab_size)
        self.micro_batch_size = config.actor.micro_batch_size

    @register(Dispatch.DP)
    def compute_teacher_log_prob(self, batch: Batch) -> Batch:
        rows, width = len(batch), batch["response_mask"].shape[1]
        if rows == 0:   # a rank's share of a teacher routed fewer rows than the group has ranks
            return Batch(empty_teacher_outputs(0, width, self.topk), batch.meta)
        with torch.no_grad():
            out = batched_response_outputs(self.model, self.device, batch, self.micro_batch_size,
                                           forward=teacher_outputs, k=self.topk)
        return Batch(out, batch.meta)


def teacher_outputs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_width: int, *,
                    k: int) -> dict[str, torch.Tensor]:
    """The teacher's log-prob of each response token and its top-k next tokens, at temperature 1."""
    logits, layout = response_logits(model, input_ids, attention_mask, response_width)
    log_probs = torch.log_softmax(logits, -1)                              # [M, V]
    sampled = log_probs.gather(-1, layout.targets[:, None].long())         # [M, 1]
    top, ids = log_probs.topk(k, -1)                                       # [M, K]
    valid = layout.response_valid
    return {"teacher_log_prob": scatter_rows(sampled, valid)[..., 0],
            "teacher_topk_ids": scatter_rows(ids, valid),
            "teacher_topk_log_prob": scatter_rows(top, valid),
            "in_teacher_topk": scatter_rows((ids == layout.targets[:, None]).any(-1, keepdim=True), valid)[..., 0]}


def empty_teacher_outputs(rows: int, width: int, k: int) -> dict[str, np.ndarray]:
    """The teacher's columns for `rows` rows that no teacher scored (zeros)."""
    return {"teacher_log_prob": np.zeros((rows, width), np.float32),
            "teacher_topk_ids": np.zeros((rows, width, k), np.int64),
            "teacher_topk_log_prob": np.zeros((rows, width, k), np.float32),
            "in_teacher_topk": np.zeros((rows, width), bool)}
