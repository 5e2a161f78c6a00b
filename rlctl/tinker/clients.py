"""The server's live training and sampling clients by id, what frees them, and why a freed one is gone.

A training client holds its LoRA adapter on the shared base, its gradients and its AdamW state; a
sampling client holds an adapter slot of its base's sampling engine. They are freed
  - when their session finishes: the SDK's `ServiceClient.close(...)` posts
    /api/v1/sessions/<id>/finish, and every client the session made goes;
  - training clients beyond `--max-clients`: creating one more frees the least recently used;
  - sampling clients beyond `--max-samplers`: making one more frees the oldest.
A request naming a freed client fails in one line saying which of these happened (404, the SDK's
error shape). Training state lives on the worker thread, so a training client is freed there
(`TrainingRun.close`), after the jobs already queued before it; a job queued for it that runs
afterwards fails with the same line.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict

from rlctl.tinker.futures import Futures, Reply
from rlctl.tinker.sampling import Sampler
from rlctl.tinker.training import TrainingRun
from rlctl.tinker.wire import TinkerError

log = logging.getLogger("rlctl.tinker")
SESSION_DONE = "was released: its session finished (ServiceClient.close); create a new client to go on"


class Clients:
    def __init__(self, futures: Futures, *, max_samplers: int, max_clients: int | None):
        self.futures, self.max_samplers, self.max_clients = futures, max_samplers, max_clients
        self.runs: OrderedDict[str, TrainingRun] = OrderedDict()   # least recently used first
        self.samplers: OrderedDict[str, Sampler] = OrderedDict()   # oldest first
        self.gone: dict[str, str] = {}                              # freed id -> why
        self._lock = threading.Lock()

    # -- training clients ---------------------------------------------------------------------
    def run(self, model_id: str | None) -> TrainingRun:
        """The live training client `model_id` (now its most recently used), else a 404 saying why."""
        with self._lock:
            found = self.runs.get(model_id or "")
            if found is not None:
                self.runs.move_to_end(found.model_id)
                return found
            why = self.gone.get(model_id or "")
        raise TinkerError(f"training client {model_id!r} {why or 'is unknown to this server'}", status=404)

    def check_live(self, run: TrainingRun) -> None:
        """In a worker job: the client was not freed while the job waited."""
        if run.closed:
            raise TinkerError(f"training client {run.model_id!r} {self.gone.get(run.model_id, 'was released')}",
                              status=404)

    def add_run(self, run: TrainingRun) -> None:
        """Keep a new training client (on the worker thread); beyond --max-clients the least recently
        used one is freed here and now."""
        with self._lock:
            if run.model_id in self.runs:
                raise TinkerError(f"model_id {run.model_id!r} exists already", status=409)
            self.runs[run.model_id] = run
            over = []
            while self.max_clients is not None and len(self.runs) > self.max_clients:
                old_id, old = self.runs.popitem(last=False)
                self.gone[old_id] = (f"was evicted: this server keeps {self.max_clients} training clients "
                                     "(--max-clients) and this one was the least recently used; "
                                     "save_state regularly and create_training_client_from_state to go on")
                over.append(old)
        for old in over:
            log.info("training client %s evicted (--max-clients %d)", old.model_id, self.max_clients)
            old.close()

    # -- sampling clients ---------------------------------------------------------------------
    def sampler(self, sampler_id: str | None) -> Sampler:
        with self._lock:
            found = self.samplers.get(sampler_id or "")
            why = self.gone.get(sampler_id or "")
        if found is None:
            raise TinkerError(f"sampling session {sampler_id!r} {why or 'is unknown to this server'}", status=404)
        return found

    def add_sampler(self, sampler: Sampler, adapter) -> None:
        """Keep `sampler`, its adapter (a LoraAdapter, None for the plain base) put in a slot of its
        base's engine; the oldest beyond --max-samplers is freed (its slot is reused once no queued
        or running row holds it)."""
        from rlctl.api.api_error import APIError

        if adapter is not None:
            try:
                sampler.base.engine.put_adapter(adapter)
            except APIError as e:
                raise TinkerError(e.message, status=e.status) from None
        with self._lock:
            self.samplers[sampler.sampler_id] = sampler
            over = []
            while len(self.samplers) > self.max_samplers:
                old_id, old = self.samplers.popitem(last=False)
                self.gone[old_id] = (f"was evicted: this server keeps the {self.max_samplers} newest sampling "
                                     "clients' weights (--max-samplers); create a new sampling client")
                over.append(old)
        self._unload(over)

    # -- sessions -----------------------------------------------------------------------------
    def finish_session(self, session_id: str) -> None:
        """Free every client the session made (ids start with the session id)."""
        def mine(client_id: str) -> bool:
            return client_id.split(":", 1)[0] == session_id
        with self._lock:
            runs = [self.runs.pop(i) for i in [i for i in self.runs if mine(i)]]
            samplers = [self.samplers.pop(i) for i in [i for i in self.samplers if mine(i)]]
            self.gone.update({c: SESSION_DONE for c in [r.model_id for r in runs] + [s.sampler_id for s in samplers]})
        log.info("session %s finished: freeing %d training and %d sampling clients", session_id, len(runs), len(samplers))
        self._unload(samplers)
        for run in runs:
            self.futures.submit(lambda r=run: Reply(r.close()))

    def counts(self) -> dict:
        with self._lock:
            return {"training_clients": len(self.runs), "sampling_clients": len(self.samplers)}

    @staticmethod
    def _unload(samplers: list[Sampler]) -> None:
        # called outside the lock: a thread holding it must never wait on the engine's thread
        for old in samplers:
            if old.adapter:
                old.base.engine.unload_adapter(old.adapter)
