"""Futures, and the one worker thread that runs all training work.

Every model-touching route returns a request id at once; the SDK polls /retrieve_future until the
result is there. The worker runs jobs one at a time (one model on one machine: running two at
once would only split the same cores), in arrival order, except that a training client's jobs
carry its seq_id (1, 2, 3, ... per client, in the order its calls were made) and each waits until
that client's previous one has run, whatever order the HTTP requests landed in. Sampling requests
get a future too (`open`), resolved by the sampling engine's thread when their rows end.
"""

from __future__ import annotations

import itertools
import logging
import threading
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable

from rlctl.tinker.wire import TinkerError

log = logging.getLogger("rlctl.tinker")
KEEP_RESULTS = 4096          # finished results kept for polling (and re-polling after a dropped connection)


@dataclass
class Reply:
    body: Any                        # a JSON-able dict, or protobuf bytes
    content_type: str = "application/json"


@dataclass
class _Job:
    request_id: str
    fn: Callable[[], Reply]
    gate: tuple[str, int] | None     # (model_id, seq_id): run only after that model's seq_id - 1


class Futures:
    def __init__(self):
        self._cond = threading.Condition()
        self._results: OrderedDict[str, Reply | TinkerError | None] = OrderedDict()   # None = pending
        self._jobs: list[_Job] = []
        self._next_seq: dict[str, int] = {}
        self._seen: dict[tuple[str, int], str] = {}   # (model_id, seq_id) -> request id: a resent request is one job
        self._counter = itertools.count(1)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="tinker-worker", daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[[], Reply], gate: tuple[str, int] | None = None) -> str:
        with self._cond:
            if gate is not None and gate in self._seen:
                return self._seen[gate]
            request_id = self._open()
            if gate is not None:
                self._seen[gate] = request_id
                self._next_seq.setdefault(gate[0], 1)
            self._jobs.append(_Job(request_id, fn, gate))
            self._cond.notify_all()
            return request_id

    def open(self) -> str:
        """A pending request id whose result comes from elsewhere (`resolve`): sampling, which the
        sampling engine's own thread finishes."""
        with self._cond:
            return self._open()

    def resolve(self, request_id: str, result: Reply | TinkerError) -> None:
        with self._cond:
            self._results[request_id] = result
            self._trim()
            self._cond.notify_all()

    def _open(self) -> str:
        request_id = f"req-{next(self._counter)}-{uuid.uuid4().hex[:8]}"
        self._results[request_id] = None
        return request_id

    def wait(self, request_id: str, timeout: float) -> Reply | TinkerError | None:
        """The finished result, or None if still pending after `timeout` seconds."""
        with self._cond:
            if request_id not in self._results:
                raise TinkerError(f"unknown request id {request_id!r} (never issued, or finished long ago)", status=404)
            self._cond.wait_for(lambda: self._results.get(request_id) is not None, timeout=timeout)
            return self._results.get(request_id)

    def forget_model(self, model_id: str) -> None:
        with self._cond:
            self._next_seq.pop(model_id, None)

    def stop(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout=10)

    def _runnable(self) -> _Job | None:
        for i, job in enumerate(self._jobs):
            if job.gate is None or job.gate[1] <= self._next_seq.get(job.gate[0], 1):
                return self._jobs.pop(i)
        return None

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or self._runnable_exists())
                if self._stopping:
                    return
                job = self._runnable()
            result = self._execute(job)
            with self._cond:
                self._results[job.request_id] = result
                if job.gate is not None:
                    self._next_seq[job.gate[0]] = max(self._next_seq.get(job.gate[0], 1), job.gate[1] + 1)
                self._trim()
                self._cond.notify_all()

    def _trim(self) -> None:
        while len(self._results) > KEEP_RESULTS and next(iter(self._results.values())) is not None:
            self._results.popitem(last=False)

    def _runnable_exists(self) -> bool:
        return any(j.gate is None or j.gate[1] <= self._next_seq.get(j.gate[0], 1) for j in self._jobs)

    @staticmethod
    def _execute(job: _Job) -> Reply | TinkerError:
        try:
            return job.fn()
        except TinkerError as e:
            log.info("%s failed: %s", job.request_id, e.message)
            return e
        except Exception as e:   # a bug or an engine failure: this request fails, the server goes on
            log.exception("%s failed", job.request_id)
            return TinkerError(f"internal error: {type(e).__name__}: {e}", status=500, category="server")
