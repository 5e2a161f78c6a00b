"""`run.log_rollouts`: every sample of a step, as trained on, in rollouts/step_<N>.jsonl.

One JSON object per line: `prompt_ids` and `response_ids` (no padding), `response_mask` (1 = a
token the model generated, 0 = tool or interaction text or template glue), `messages` (the whole
conversation; for a single-turn sample the prompt plus the decoded response), `score`, the row's
uid, data_source and acc, multi-turn's `num_turns`, `turn_scores`, `tool_rewards`, `finish` and
`tool_calls` ({name, arguments, error} per call), agent programs' `agent_episode` (the rows of one
episode share it) and a failed episode's `agent_failure`, and per response token `log_probs` (the
update's old log-probs) and `advantages`, rounded to 4 decimals (`rlctl view` shades tokens by
them). A resumed run rewrites the steps it repeats.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from rlctl.controller.metrics_log import _jsonable
from rlctl.utils.atomic_files import atomic_write_text


def rollout_records(batch, fields=None) -> list[dict]:
    """One record per row; `fields(batch, row)`: the rollout kind's own fields of a row
    (rlctl.rollouts.base.Rollout.record_fields, e.g. the whole conversation as its `messages`)."""
    width = batch["prompts"].shape[1]
    # the log-probs the update used: recomputed old_log_prob, else the engine's own
    log_probs = "old_log_prob" if "old_log_prob" in batch else "rollout_log_prob"
    prompt_valid = batch["attention_mask"][:, :width] != 0
    records = []
    for r in range(len(batch)):
        length = int(batch["response_length"][r])
        own = fields(batch, r) if fields is not None else {}
        record = {"uid": str(batch["uid"][r]), "data_source": str(batch["data_source"][r]),
                  "prompt_ids": batch["prompts"][r][prompt_valid[r]].tolist(),
                  "response_ids": batch["responses"][r, :length].tolist(),
                  "response_mask": batch["response_mask"][r, :length].astype(np.int64).tolist(),
                  "messages": own.pop("messages", None) or _prompt_and_answer(batch, r),
                  "score": float(batch["scores"][r]), "acc": float(batch["acc"][r]), **own}
        for key, column in (("log_probs", log_probs), ("advantages", "advantages")):
            if column in batch:   # per response token, for `rlctl view`'s shading (4 decimals keep the lines short)
                record[key] = np.round(batch[column][r, :length].astype(np.float64), 4).tolist()
        records.append(record)
    return records


def _prompt_and_answer(batch, r: int) -> list[dict]:
    prompt = batch["messages"][r] if "messages" in batch else None
    return list(prompt or []) + [{"role": "assistant", "content": str(batch["response_text"][r])}]


def write_rollouts(run_dir: Path, step: int, batch, fields=None) -> Path:
    """Write rollouts/step_<step>.jsonl atomically (`fields`: as rollout_records takes it); NaN (a failed
    turn score) is written as null."""
    from rlctl.checkpoint.run_lock import check_run_folder

    check_run_folder(run_dir)   # never into a folder that replaced the locked one
    path = Path(run_dir) / "rollouts" / f"step_{step}.jsonl"
    atomic_write_text(path, "".join(json.dumps(_jsonable(record), ensure_ascii=False) + "\n"
                                    for record in rollout_records(batch, fields)))
    return path
