"""`RewardModelWorker`: a sequence-classification reward model (reward.model) on one rank.

The reward model reads text, not the policy's token ids: the two tokenizers may differ. Each
sample's chat (the prompt's messages + the response as the assistant turn) is rendered with the
reward model's own chat template, tokenized, right-padded into micro-batches, and scored by the
model's head at each sequence's last real token: the same number transformers gives for the
sequence alone (`AutoModelForSequenceClassification(...)(ids).logits[0, 0]`).

Batch keys:  compute_rm_scores  in: messages (object [B]: list of chat dicts), response_text (object [B])
                                out: rm_scores [B] float32
"""

from __future__ import annotations

import numpy as np
import torch

from rlctl.errors import DataError
from rlctl.runtime import Batch, Dispatch, register
from rlctl.workers.parallel import fsdp


class RewardModelWorker:
    """Inference only: the model is loaded whole on every rank and never trained."""

    def __init__(self, config):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from rlctl.models.loading import quiet_transformers

        quiet_transformers()
        path, trust = config.reward.model, config.model.trust_remote_code
        self.micro_batch_size = config.reward.model_micro_batch_size
        self.device = fsdp.device()
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust)
            model = AutoModelForSequenceClassification.from_pretrained(
                path, dtype=fsdp.resolve_dtype(config.model.dtype), trust_remote_code=trust)
        except (OSError, ValueError) as err:
            raise DataError(f"cannot load reward.model {path!r}: {str(err).splitlines()[0]}",
                            hint="point reward.model at a Hugging Face sequence-classification folder or hub id "
                                 "(`rlctl model tiny --reward-model OUT` writes one).") from None
        if model.config.num_labels != 1:
            raise DataError(f"reward.model {path!r} has {model.config.num_labels} labels; a reward model has one",
                            hint="use a model trained as a reward model (one score per sequence).")
        self.model = model.to(self.device).eval()
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None \
            else self.tokenizer.eos_token_id
        self.max_length = getattr(model.config, "max_position_embeddings", None) or 1 << 30

    @register(Dispatch.DP)
    def compute_rm_scores(self, batch: Batch) -> Batch:
        ids = [self._encode(m, r) for m, r in zip(batch["messages"], batch["response_text"])]
        scores = []
        with torch.no_grad():
            for start in range(0, len(ids), self.micro_batch_size):
                scores.append(self._score(ids[start:start + self.micro_batch_size]))
        out = np.concatenate(scores) if scores else np.zeros(0, dtype=np.float32)
        return Batch({"rm_scores": out.astype(np.float32)}, batch.meta)

    def _encode(self, messages, response: str) -> list[int]:
        chat = [dict(m) for m in (messages or [])] + [{"role": "assistant", "content": str(response)}]
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(chat, tokenize=False)
        else:  # a reward model without a chat template reads the plain turns
            text = "\n".join(m["content"] for m in chat)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return ids[-self.max_length:]  # the score is read at the end: keep the end

    def _score(self, rows: list[list[int]]) -> np.ndarray:
        """Right-padded forward; the head's logit at each row's last real token."""
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, :len(r)] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        last = mask.sum(-1) - 1
        head = getattr(self.model, "score", None)
        base = getattr(self.model, self.model.base_model_prefix, None)
        if head is None or base is None:  # another head layout: score each sequence alone, unpadded
            return np.array([float(self.model(input_ids=input_ids[i:i + 1, :len(r)]).logits[0, 0])
                             for i, r in enumerate(rows)], dtype=np.float32)
        hidden = base(input_ids=input_ids, attention_mask=mask).last_hidden_state
        picked = hidden[torch.arange(len(rows), device=hidden.device), last]
        return head(picked)[:, 0].float().cpu().numpy()
