"""A distillation teacher behind an OpenAI-compatible URL (distill.teacher_url): vLLM's `vllm serve`
or `rlctl serve --prompt-logprobs K`, both answering /v1/completions' `prompt_logprobs`.

Each row is sent as token ids (prompt ++ response, padding dropped) with max_tokens = 1 and
prompt_logprobs = distill.topk; the answer's entry for each response token gives the teacher's
log-prob of that token and its top-k, the same columns a TeacherWorker returns. The server must
use the student's tokenizer (the ids are sent as they are); it scores at temperature 1.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from rlctl.errors import WorkerDiedError
from rlctl.runtime.batch import Batch
from rlctl.utils.http import HttpFailure, post_json

TIMEOUT_S = 300.0   # one row's request; a long prompt on a busy server takes a while
RETRIES = 2
CONCURRENCY = 8     # requests in flight at once
MISSING = -1e4      # log-prob of a top-k slot the server did not fill (fewer than k entries)


class TeacherClient:
    def __init__(self, config):
        d = config.distill
        self.url = d.teacher_url.rstrip("/") + "/completions"
        self.model, self.k = d.teacher_model, d.topk

    def compute_teacher_log_prob(self, batch: Batch) -> Batch:
        prompt_width = batch["input_ids"].shape[1] - batch["response_mask"].shape[1]
        rows = [(ids[mask != 0].tolist(), int(mask[:prompt_width].sum()), int(mask[prompt_width:].sum()))
                for ids, mask in zip(batch["input_ids"], batch["attention_mask"])]
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            entries = list(pool.map(self._score, [ids for ids, _, _ in rows]))
        width = batch["response_mask"].shape[1]
        out = {"teacher_log_prob": np.zeros((len(rows), width), np.float32),
               "teacher_topk_ids": np.zeros((len(rows), width, self.k), np.int64),
               "teacher_topk_log_prob": np.full((len(rows), width, self.k), MISSING, np.float32),
               "in_teacher_topk": np.zeros((len(rows), width), bool)}
        for i, ((ids, prompt_len, response_len), row) in enumerate(zip(rows, entries)):
            for j in range(response_len):
                self._fill(out, i, j, ids[prompt_len + j], row[prompt_len + j])
        return Batch(out, batch.meta)

    def _score(self, ids: list[int]) -> list:
        payload = {"model": self.model, "prompt": ids, "max_tokens": 1, "temperature": 0.0,
                   "prompt_logprobs": self.k}
        try:
            answer = post_json(self.url, payload, timeout_s=TIMEOUT_S, retries=RETRIES, timeout_key="")
            entries = answer["choices"][0]["prompt_logprobs"]
        except HttpFailure as e:
            raise WorkerDiedError(f"the distillation teacher at {self.url} failed: {e}",
                                  hint="check distill.teacher_url and that the server answers prompt_logprobs "
                                       "(vllm serve, or rlctl serve --prompt-logprobs K)") from None
        except (KeyError, IndexError, TypeError):
            raise WorkerDiedError(f"the distillation teacher at {self.url} answered without "
                                  "choices[0].prompt_logprobs",
                                  hint="serve the teacher with vLLM or `rlctl serve --prompt-logprobs K`") from None
        if not isinstance(entries, list) or len(entries) != len(ids):
            raise WorkerDiedError(f"the distillation teacher at {self.url} answered prompt_logprobs for "
                                  f"{len(entries) if isinstance(entries, list) else 'no'} of {len(ids)} tokens",
                                  hint="the server must take the token ids as they are (the student's tokenizer)")
        return entries

    def _fill(self, out: dict, i: int, j: int, token: int, entry: dict) -> None:
        """Row i, response column j from one prompt_logprobs entry {id: {logprob, rank}}."""
        ranked = sorted(((int(v["rank"]), int(t), float(v["logprob"])) for t, v in entry.items()))
        top = [r for r in ranked if r[0] <= self.k][:self.k]
        out["teacher_log_prob"][i, j] = float(entry[str(token)]["logprob"])
        out["teacher_topk_ids"][i, j, :len(top)] = [t for _, t, _ in top]
        out["teacher_topk_log_prob"][i, j, :len(top)] = [v for _, _, v in top]
        out["in_teacher_topk"][i, j] = any(t == token for _, t, _ in top)
