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
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from typing import TYPE_CHECKING

from rlctl.runtime.batch import Batch

if TYPE_CHECKING:
    from rlctl.controller.setup import TrainSetup
    from rlctl.runtime.worker_group import RoleHandle


class TurnQueue:
    """The rollout group as the async source sees it (`submit(method, ...)` -> something with
    `.result()`, `export_weights()`), with `generate` running the multi-turn loop."""

    def __init__(self, setup: TrainSetup, group: RoleHandle):
        from rlctl.controller.offpolicy import _turn_loop

        self.group, self.turns = group, _turn_loop(setup, group)
        self.jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.last_end = time.perf_counter()
        threading.Thread(target=self._run, daemon=True, name="rlctl-async-multi-turn").start()

    def submit(self, method: str, *args, **kwargs) -> Future:
        """Queue `method` behind every call submitted before it; `generate` is a multi-turn batch."""
        if method == "generate":
            return self._queue(self._generate, *args, **kwargs)
        return self._queue(lambda: self.group.submit(method, *args, **kwargs).result())

    def export_weights(self) -> dict:
        """The weights the group holds once every queued call has run."""
        return self._queue(self.group.export_weights).result()

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
