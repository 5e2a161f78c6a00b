"""Multi-turn rollouts in rollout.mode = "async" (whole batches): the rollout group behind one queue.

Single-turn, the async source (rlctl.controller.async_rollout) sends each batch to the rollout
group as one `generate` call, and the group runs its calls in the order they were submitted, so
the weights a batch uses are those of the last push submitted before it. A multi-turn batch is
many calls (one `generate_turn` per turn, tools and the interaction between them on this
process, then `tag_rollout`), so `TurnQueue` stands in for the group: each `submit` becomes a job
that one thread of this process runs in submission order, a whole conversation batch being one
job. A push queued behind K batches therefore lands after their last turns and before the next
batch's first, exactly where the single-turn push lands: every turn of a conversation comes from
the same weights, the schedule (rlctl.controller.async_schedule) and its staleness bound hold
unchanged, K = 1 runs one_step_off's order, and resume is exact. The trainer never waits on a
push: the weights are exported when it is queued and loaded when its turn comes (a queued push
holds its copy until then).

async/idle_rollout counts the queue's thread: idle while it has no job, busy from a batch's first
turn to its tagging (tool calls included).

With rollout.partial_rollout, `generate_round` is one round of conversations (`TurnPool`, the
multi-turn counterpart of rlctl.workers.rollout.partial.PartialPool, kept here beside the tools):
admit the new prompts, run ONE turn of every live conversation with the weights the group holds
now, then its tools or interaction, and return the groups whose rollout.n conversations have all
ended. A push queued between two rounds therefore lands between two turns of a conversation.
Each model token carries the version that sampled it (`token_version`; tool, interaction and
template tokens -1, mask 0) and its log-prob under those weights, computed right after its turn.
The pool (every live conversation, with the tool and interaction objects that hold their state)
pickles into the async checkpoint, so resume continues each conversation at its next turn.
The pool lives here, not on a rank, so several rollout ranks share it; a turn's tagging call is
padded to the rank count (`fill_ranks`) when fewer conversations are live than ranks.
"""

from __future__ import annotations

import pickle
import queue
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np

from rlctl.runtime.batch import Batch

if TYPE_CHECKING:
    from rlctl.controller.setup import TrainSetup
    from rlctl.runtime.worker_group import RoleHandle


class TurnQueue:
    """The rollout group as the async source sees it (`submit(method, ...)` -> something with
    `.result()`, `export_weights()`), with `generate` running the multi-turn loop."""

    def __init__(self, setup: TrainSetup, group: RoleHandle):
        from rlctl.controller.offpolicy import rollout_over

        self.group, self.turns = group, rollout_over(setup, group)
        self.pool = TurnPool(setup.config, self.turns) if setup.config.rollout.partial_rollout else None
        self.version = 0   # the version the group holds once the jobs queued so far have run
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.last_end = time.perf_counter()
        threading.Thread(target=self._run, daemon=True, name="rlctl-async-multi-turn").start()

    def submit(self, method: str, *args, **kwargs) -> Future:
        """Queue `method` behind every call submitted before it; `generate` is a multi-turn batch."""
        if method == "generate":
            return self._queue(self._generate, *args, **kwargs)
        if method == "generate_round":
            return self._queue(self._round, *args, **kwargs)
        if method == "load_pool":
            return self._queue(self.pool.load_state_dict, *args)
        if method == "update_weights":
            return self._queue(self._update_weights, *args, **kwargs)
        return self._queue(lambda: self.group.submit(method, *args, **kwargs).result())

    def export_weights(self) -> dict:
        """The weights the group holds once every queued call has run."""
        return self._queue(self.group.export_weights).result()

    def export_pool(self) -> bytes | None:
        """Partial rollouts: the live conversations once every queued call has run (a checkpoint)."""
        return self._queue(self.pool.state_dict).result() if self.pool is not None else None

    def forget_cache(self) -> None:
        self._queue(lambda: self.group.forget_cache()).result()

    def close(self) -> None:
        self.jobs.put(None)
        self.turns.close()

    def _queue(self, fn, *args, **kwargs) -> Future:
        future: Future = Future()
        self.jobs.put((future, fn, args, kwargs))
        return future

    def _run(self) -> None:
        while (job := self.jobs.get()) is not None:
            future, fn, args, kwargs = job
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as e:   # surfaces in the trainer's thread, at .result()
                future.set_exception(e)

    def _generate(self, prompts: Batch, *, seed: int) -> Batch:
        """One training batch of conversations, every turn with the weights the group holds now,
        tagged with their version and log-probs (as one_step_off's)."""
        start = time.perf_counter()
        batch = self.turns.generate(prompts, seed=seed, mode="train")
        model = Batch({key: batch[key] for key in ("input_ids", "attention_mask", "response_mask")})
        batch = batch.union(self.group.tag_rollout(model))
        idle, self.last_end = start - self.last_end, time.perf_counter()
        batch.meta.update(rollout_idle_s=idle, rollout_busy_s=self.last_end - start)
        return batch

    def _update_weights(self, weights: dict, *, version: int) -> int:
        result = self.group.submit("update_weights", weights, version=version).result()
        self.version = int(version)
        return result

    def _round(self, prompts: Batch | None, *, seed: int) -> Batch:
        """One round of partial multi-turn rollouts (TurnPool.round) on the weights held now."""
        start = time.perf_counter()
        batch = self.pool.round(prompts, seed=seed, version=self.version)
        idle, self.last_end = start - self.last_end, time.perf_counter()
        batch.meta.update(rollout_idle_s=idle, rollout_busy_s=self.last_end - start, **self.pool.meta())
        return batch


class TurnPool:
    """Live conversations of partial multi-turn rollouts, in admission order; a group (a prompt and
    its rollout.n conversations) leaves when all of them have ended. `turns`: the ToolLoop
    whose tools, interaction, renderer and turn call it uses."""

    def __init__(self, config, turns):
        self.config, self.turns, self.n = config, turns, config.rollout.n
        self.entries: list[dict] = []   # {"group", "conv" (Conversation), "versions" [len(response_ids)]}
        self.groups: dict[int, tuple] = {}   # group id -> its prompt row (tensors, meta)
        self.next_group = 0

    def round(self, prompts: Batch | None, *, seed: int, version: int) -> Batch:
        """Admit `prompts` (None: none), run one turn of every live conversation on the group's
        weights (`version`), then its tools or interaction; return the groups that ended."""
        turns, budget = self.turns, self.config.data.max_response_length
        if prompts is not None:
            self._admit(prompts)
        live = [e for e in self.entries if not e["conv"].done]
        if live:
            convs = [e["conv"] for e in live]
            inputs = [c.prompt_ids + c.response_ids for c in convs]
            limits = [min(budget - len(c.response_ids), turns.mt.max_turn_length or budget) for c in convs]
            # no kept KV: a push may land before the next turn, whose context is prefilled again
            out = turns._generate_turn(inputs, limits, 1, seed=seed, mode="train", keys=[-1] * len(convs),
                                       reuse=False, homes={})
            log_probs = self._log_probs(inputs, out)
            for j, (e, c) in enumerate(zip(live, convs)):
                length = int(out["response_length"][j])
                c.add_turn(turns.renderer, out["responses"][j, :length].tolist(), log_probs[j, :length].tolist(),
                           truncated=bool(out["truncated"][j]), eos_ids=turns.eos_ids,
                           at_budget=len(c.response_ids) + length >= budget, max_turns=turns.mt.max_turns,
                           has_tools=bool(turns.runner.tools), has_interaction=turns.interaction is not None,
                           fmt=turns.mt.tool_format)
                e["versions"] += [int(version)] * length
            turns.events.run(turns._between_turns(convs, budget))
            for e in live:   # tool answers, interaction turns, template glue: no version
                e["versions"] += [-1] * (len(e["conv"].response_ids) - len(e["versions"]))
        return self._pop_finished()

    def _admit(self, prompts: Batch) -> None:
        turns = self.turns
        new = []
        for row in range(len(prompts)):
            ids = prompts["input_ids"][row][prompts["attention_mask"][row] != 0].tolist()
            one = prompts.select([row])
            self.groups[self.next_group] = (one.tensors, one.meta)
            for _ in range(self.n):
                conv = turns._start(ids, prompts["messages"][row], prompts["extra_info"][row])
                self.entries.append({"group": self.next_group, "conv": conv, "versions": []})
                new.append(conv)
            self.next_group += 1
        turns.events.run(turns._gather([turns._start_interaction(c) for c in new]))

    def _log_probs(self, contexts: list[list[int]], out: Batch) -> np.ndarray:
        """The group's log-probs [R, C] of the turn it just sampled after each context (its current weights)."""
        width = max(len(c) for c in contexts)
        ids = np.full((len(contexts), width), self.turns.pad, dtype=np.int64)
        mask = np.zeros((len(contexts), width), dtype=np.int64)
        for r, c in enumerate(contexts):
            ids[r, width - len(c):], mask[r, width - len(c):] = c, 1
        responses = out["responses"].astype(np.int64)
        response_mask = (np.arange(responses.shape[1])[None, :] < out["response_length"][:, None]).astype(np.int64)
        responses = np.where(response_mask > 0, responses, self.turns.pad)
        batch = Batch({"input_ids": np.concatenate([ids, responses], axis=1),
                       "attention_mask": np.concatenate([mask, response_mask], axis=1),
                       "response_mask": response_mask.astype(np.float32)})
        tags = self.turns.group.tag_rollout(fill_ranks(batch, self.turns.group.world_size))
        return tags["rollout_log_prob"][:len(batch)]

    def _pop_finished(self) -> Batch:
        """The groups whose n conversations have all ended, in admission order, as the whole-batch
        rows plus token_version [B, T]; their tools and interactions are released. Empty when none."""
        by_group: dict[int, list[dict]] = {}
        for e in self.entries:
            by_group.setdefault(e["group"], []).append(e)
        done = {g: None for g, es in by_group.items() if all(e["conv"].done for e in es)}   # in admission order
        if not done:
            return Batch()
        self.entries = [e for e in self.entries if e["group"] not in done]
        turns, width = self.turns, self.config.data.max_response_length
        turns.events.run(turns._gather([turns._finish(e["conv"]) for g in done for e in by_group[g]]))
        parts = []
        for g in done:
            tensors, meta = self.groups.pop(g)
            entries = by_group[g]
            rows = turns._batch(Batch(tensors, meta), [e["conv"] for e in entries], self.n)
            versions = np.full((len(entries), width), -1, dtype=np.int64)
            log_probs = np.zeros((len(entries), width), dtype=np.float32)
            for r, e in enumerate(entries):
                versions[r, :len(e["versions"])] = e["versions"]
                log_probs[r, :len(e["versions"])] = e["conv"].log_probs
            rows["token_version"], rows["rollout_log_prob"] = versions, log_probs
            rows["policy_version"] = np.where(versions >= 0, versions, np.iinfo(np.int64).max).min(axis=1)
            parts.append(rows)
        if len(parts) == 1:
            return parts[0]
        from rlctl.controller.rollout import align_prompt_width

        return Batch.concat(align_prompt_width(parts, turns.pad))

    def meta(self) -> dict:
        """As PartialPool.meta: pool_rows (conversations of groups not returned yet) and pool_oldest
        (the oldest model token's version among them; None when none has one)."""
        oldest = [min(v for v in e["versions"] if v >= 0) for e in self.entries if any(v >= 0 for v in e["versions"])]
        return {"pool_rows": len(self.entries), "pool_oldest": min(oldest) if oldest else None}

    def state_dict(self) -> bytes:
        """The live conversations pickled with the tool and interaction objects (a verl tool or
        interaction keeps a conversation's state in itself, by instance id), so references stay shared."""
        state = {"entries": self.entries, "groups": self.groups, "next_group": self.next_group,
                 "tools": self.turns.runner.tools, "interaction": self.turns.interaction}
        try:
            return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as e:
            from rlctl.errors import CheckpointError

            raise CheckpointError(f"partial multi-turn rollouts: the live conversations cannot be saved: a tool or "
                                  f"the interaction holds state that does not pickle ({type(e).__name__}: {e})",
                                  hint="make that state picklable, or set run.save_every = 0") from e

    def load_state_dict(self, blob: bytes | None) -> None:
        if blob is None:
            return
        try:   # the tools' and interaction's classes come from their files, imported by now
            state = pickle.loads(blob)
        except Exception as e:
            from rlctl.errors import CheckpointError

            raise CheckpointError(f"partial multi-turn rollouts: the saved conversations do not load "
                                  f"({type(e).__name__}: {e})", hint="keep the tool and interaction files where "
                                  "they were when the checkpoint was saved, or resume from another step") from e
        self.entries, self.groups, self.next_group = state["entries"], state["groups"], int(state["next_group"])
        self.turns.runner.tools, self.turns.interaction = state["tools"], state["interaction"]


def fill_ranks(batch: Batch, world: int) -> Batch:
    """`batch` with its last row repeated until every one of `world` ranks gets a row: a Dispatch.DP
    call cannot split fewer rows than ranks, and late in a round few conversations may be live. Each
    rank computes its rows alone, so the copies leave the real rows' results unchanged; the caller
    keeps the first len(batch) rows of the result."""
    if len(batch) >= world:
        return batch
    return batch.select(list(range(len(batch))) + [len(batch) - 1] * (world - len(batch)))
