"""Partial rollouts on the async rollout ranks (rollout.partial_rollout = true): generation in rounds.

Without partial rollouts a generation call decodes its batch to the end, so one long sample holds
its whole batch (and every call queued behind it, weight pushes included). With them the rollout
rank keeps a pool of unfinished samples between calls, and each call (`generate_round`) is one
round: admit the new prompts (rollout.n samples each), decode every sample in the pool for at most
rollout.partial_chunk tokens with the weights the rank holds now, and return the groups whose
rollout.n samples have all finished (EOS or data.max_response_length). A weight push runs between
two rounds, so an unfinished sample keeps its tokens and log-probs and continues on the new
weights: its prompt and tokens so far are prefilled again with them (the KV cache is rebuilt on the
new weights, never reused across a push).

Versions are per token (AReaL's choice, not verl's per trajectory): `token_version [B, T]` is the
version of the weights that sampled each response token (-1 on padding), `rollout_log_prob [B, T]`
their log-prob of it, computed right after the round with those same weights, and
`policy_version [B]` the oldest token's version, which is what the staleness bound checks.

Each rollout rank keeps a pool of its own: a round is data-parallel over the rank (Dispatch.DP),
the new prompts split over them in consecutive shares (rank r samples from (seed, r)), and the
controller merges the ranks' parts (rlctl.controller.async_rollout.merge_rounds: pool_rows summed,
pool_oldest their min). The pool is plain data (`state_dict`): an async checkpoint saves every
rank's, so resume continues every unfinished sample exactly where it was, on the same rank.
"""

from __future__ import annotations

import numpy as np

from rlctl.runtime.batch import Batch, object_array
from rlctl.runtime.policy import MODEL_KEYS


class PartialPool:
    """Unfinished samples of one rollout rank, in admission order; groups leave when all their
    samples have finished. `width`: data.max_prompt_length, `length`: data.max_response_length."""

    def __init__(self, *, n: int, chunk: int, width: int, length: int, pad: int, eos_ids: list[int]):
        self.n, self.chunk, self.width, self.length, self.pad = n, chunk, width, length, pad
        self.eos = set(int(e) for e in eos_ids)
        self.samples: list[dict] = []   # {"group", "prompt", "tokens", "log_probs", "versions", "done"}
        self.groups: dict[int, dict] = {}   # group id -> the prompt's own columns (uid, ground_truth, ...)
        self.next_group = 0

    def admit(self, prompts: Batch) -> None:
        """The batch's prompts (left-padded input_ids / attention_mask + per-prompt columns), n samples each."""
        for row in range(len(prompts)):
            ids = prompts["input_ids"][row][prompts["attention_mask"][row] != 0].tolist()
            columns = {k: v[row] for k, v in prompts.tensors.items() if k not in MODEL_KEYS}
            self.groups[self.next_group] = {"prompt": ids, "columns": columns, "meta": prompts.meta}
            for _ in range(self.n):
                self.samples.append({"group": self.next_group, "tokens": [], "log_probs": [], "versions": [],
                                     "done": False})
            self.next_group += 1

    def live(self) -> list[dict]:
        return [s for s in self.samples if not s["done"]]

    def inputs(self) -> tuple[list[list[int]], list[int]]:
        """Each unfinished sample's context (prompt ++ its tokens so far) and this round's token budget."""
        live = self.live()
        contexts = [self.groups[s["group"]]["prompt"] + s["tokens"] for s in live]
        return contexts, [min(self.chunk, self.length - len(s["tokens"])) for s in live]

    def advance(self, responses: np.ndarray, lengths: np.ndarray, log_probs: np.ndarray, version: int) -> None:
        """Append this round's tokens [R, C] (R = the live samples, in `inputs` order) with their
        log-probs [R, C] and the version that sampled them; a sample finishes at EOS or full length."""
        for s, resp, k, lp in zip(self.live(), responses, lengths, log_probs):
            new = [int(t) for t in resp[:int(k)]]
            s["tokens"] += new
            s["log_probs"] += [float(x) for x in lp[:int(k)]]
            s["versions"] += [int(version)] * len(new)
            s["done"] = bool(new and new[-1] in self.eos) or len(s["tokens"]) >= self.length

    def pop_finished(self) -> Batch:
        """The groups whose n samples have all finished, in admission order, as rollout rows (the
        columns of RolloutWorker.generate plus token_version); an empty Batch when none has."""
        by_group: dict[int, list[dict]] = {}
        for s in self.samples:
            by_group.setdefault(s["group"], []).append(s)
        done = [g for g, ss in by_group.items() if all(s["done"] for s in ss)]
        if not done:
            return Batch()
        self.samples = [s for s in self.samples if s["group"] not in set(done)]
        rows = [s for g in done for s in by_group[g]]
        batch = self._rows(rows, [self.groups[g] for g in done])
        for g in done:
            del self.groups[g]
        return batch

    def _rows(self, samples: list[dict], groups: list[dict]) -> Batch:
        """[prompt ++ response] rows, prompts left-padded to `width`, responses right-padded to `length`."""
        rows, width = len(samples), max(self.width, *(len(g["prompt"]) for g in groups))
        prompts = np.full((rows, width), self.pad, dtype=np.int64)
        prompt_mask = np.zeros((rows, width), dtype=np.int64)
        responses = np.full((rows, self.length), self.pad, dtype=np.int64)
        log_probs = np.zeros((rows, self.length), dtype=np.float32)
        versions = np.full((rows, self.length), -1, dtype=np.int64)
        for r, s in enumerate(samples):
            p, k = self.groups[s["group"]]["prompt"], len(s["tokens"])
            prompts[r, width - len(p):], prompt_mask[r, width - len(p):] = p, 1
            responses[r, :k], log_probs[r, :k], versions[r, :k] = s["tokens"], s["log_probs"], s["versions"]
        lengths = np.array([len(s["tokens"]) for s in samples], dtype=np.int64)
        response_mask = (np.arange(self.length)[None, :] < lengths[:, None]).astype(np.int64)
        columns = {}
        for key, first in groups[0]["columns"].items():
            values = [g["columns"][key] for g in groups]
            numeric = isinstance(first, (np.ndarray, np.generic))   # object columns hold python values
            column = np.stack(values) if numeric else object_array(values)
            columns[key] = np.repeat(column, self.n, axis=0)
        return Batch({**columns, "prompts": prompts, "responses": responses,
                      "response_mask": response_mask.astype(np.float32), "response_length": lengths,
                      "truncated": np.array([s["tokens"][-1] not in self.eos for s in samples]),
                      "input_ids": np.concatenate([prompts, responses], axis=1),
                      "attention_mask": np.concatenate([prompt_mask, response_mask], axis=1),
                      "rollout_log_prob": log_probs, "token_version": versions,
                      "policy_version": np.where(versions >= 0, versions, np.iinfo(np.int64).max).min(axis=1)},
                     groups[0]["meta"])

    def meta(self) -> dict:
        """What the controller learns of the pool with each round: pool_rows (samples of groups not
        returned yet) and pool_oldest (the oldest token's version among them; None when empty)."""
        firsts = [s["versions"][0] for s in self.samples if s["versions"]]
        return {"pool_rows": len(self.samples), "pool_oldest": min(firsts) if firsts else None}

    def state_dict(self) -> dict:
        return {"samples": self.samples, "groups": self.groups, "next_group": self.next_group}

    def load_state_dict(self, state: dict) -> None:
        self.samples, self.groups, self.next_group = state["samples"], state["groups"], int(state["next_group"])
