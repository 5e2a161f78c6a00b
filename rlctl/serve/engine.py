"""The built-in `hf` engine: a transformers model behind a continuous-batching scheduler thread.

Requests are queued by HTTP threads; one scheduler thread owns the model. Each loop it admits
waiting requests (all n choices of a request together, while the batch has room), prefills them
in one forward, appends them to the running decode batch, then runs one decode step for every
row. Finished or cancelled rows leave at once, so a long request never holds a short one back.

With LoRA adapters (rlctl.serve.adapters), each row carries its adapter's slot and one step
decodes rows of every adapter together (rlctl.models.lora_slots: one gathered LoRA matmul per
layer); loading and unloading run on the scheduler thread between steps (`call`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

from rlctl.api.api_error import APIError
from rlctl.api.requests import Event, Request
from rlctl.api.textstream import TextStream

log = logging.getLogger("rlctl.serve")


@dataclass
class _Row:
    request: Request
    index: int
    stream: TextStream
    generator: object  # torch.Generator | None
    matcher: object = None  # xgrammar.GrammarMatcher of a request decoded under a grammar, else None
    slot: int = 0  # LoRA adapter slot (0 = the base model)
    ids: list | None = None  # the sampled ids and their log-probs, kept when the request asks (token_ids)
    logprobs: list | None = None
    tokens: int = 0
    last_token: int = -1
    done: bool = False


def _row_seed(seed: int, choice: int) -> int:
    """Distinct, reproducible seeds for the n choices of one seeded request."""
    return (seed * 6364136223846793005 + choice * 1442695040888963407 + 1) % (2**63)


class Engine:
    """Owns model + tokenizer; `submit` is thread-safe, generation happens on the scheduler thread."""

    def __init__(self, model, tokenizer, *, max_rows: int = 32, max_waiting: int = 1024, processor=None,
                 allow_remote_images: bool = False, adapters=None):
        import torch

        from rlctl.workers.compute.vision import config_placeholder_ids

        self.model, self.tokenizer = model, tokenizer
        self.adapters = adapters  # rlctl.serve.adapters.ServedAdapters, or None: no LoRA
        self._calls: collections.deque = collections.deque()  # (fn, future) to run between steps
        # a vision-language model's processor (None: text only); remote image URLs fetched or refused
        self.processor, self.allow_remote_images = processor, allow_remote_images
        self.banned = config_placeholder_ids(model.config) if processor is not None else []
        self.max_rows, self.max_waiting = max_rows, max_waiting
        self.context_length = int(getattr(model.config, "max_position_embeddings", 0) or 2048)
        self.eos_ids = _eos_ids(model, tokenizer)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_ids[0]
        self.tokenizer_lock = threading.Lock()  # fast tokenizers are not safe to share across threads
        self._waiting: collections.deque[Request] = collections.deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._rows: list[_Row] = []
        self._batch = self._new_batch()   # rlctl.serve.batch.LiveBatch
        self.peak_rows = 0  # most rows ever decoded in one step: evidence that batching happens
        self.mixed_steps = 0  # decode forwards over rows of more than one adapter (the base counts as one)
        self.cancelled_rows = 0  # rows dropped because their client went away
        self._default_generator = torch.Generator(device=model.device)
        self._default_generator.seed()
        self._grammars = None  # rlctl.workers.rollout.grammar.GrammarCompiler, built by the first grammar
        self._thread = threading.Thread(target=self._loop, name="rlctl-scheduler", daemon=True)
        self._thread.start()

    # ---- called from HTTP threads -------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        with self.tokenizer_lock:
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        """The prompt exactly as training renders it (training's own chat_prompt_ids): the chat
        template (with the tools, if any) and the generation prompt."""
        from rlctl.data.dataset import chat_prompt_ids

        with self.tokenizer_lock:
            return chat_prompt_ids(messages, self.tokenizer, tools)

    def encode_vision_chat(self, messages: list[dict], images: list,
                           tools: list[dict] | None = None) -> tuple[list[int], dict]:
        """A VLM chat prompt through the processor: (prompt ids, image arrays for Request.vision)."""
        from rlctl.models.vision import encode_prompt

        with self.tokenizer_lock:
            enc = encode_prompt(self.processor, messages, images, tools)
        return enc["input_ids"].tolist(), enc

    def submit(self, request: Request) -> bool:
        """Queue a request; False when the waiting queue is full (the caller answers 429)."""
        with self._cond:
            if self._stopping or len(self._waiting) >= self.max_waiting:
                return False
            self._waiting.append(request)
            self._cond.notify()
        return True

    def load_adapter(self, name: str, folder: str, replace: bool = False) -> None:
        """Read and check the adapter here (file I/O), then put it in a slot between two steps."""
        from rlctl.errors import DataError

        try:
            adapter = self.adapters.read(name, folder)
        except DataError as e:
            missing = not Path(folder).is_dir()   # vLLM's LoRAAdapterNotFoundError is a 404 too
            raise APIError(404 if missing else 400, e.message, code="adapter_not_found" if missing else None) from None
        self.put_adapter(adapter, replace)

    def put_adapter(self, adapter, replace: bool = False) -> int:
        """Put a read adapter (rlctl.models.lora_adapter.LoraAdapter) in a slot between two steps."""
        return self.call(lambda: self.adapters.add(adapter, self._busy_slots(), replace))

    def unload_adapter(self, name: str) -> None:
        self.call(lambda: self.adapters.remove(name))

    def call(self, fn):
        """Run fn on the scheduler thread between two steps (so it may use the model and its adapter
        slots); its result, or its exception re-raised."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if self._stopping:
                raise APIError(503, "the server is shutting down", type="server_error")
            self._calls.append((fn, future))
            self._cond.notify()
        return future.result()

    def _busy_slots(self) -> set[int]:
        held = {r.slot for r in self._rows}
        held.update(self.adapters.slot_of(r.adapter) or 0 for r in self._waiting)
        return held - {0}

    @property
    def stopping(self) -> bool:
        return self._stopping

    def load(self) -> dict:
        with self._cond:
            return {"running": len(self._rows), "waiting": len(self._waiting), "peak_running": self.peak_rows,
                    "mixed_steps": self.mixed_steps, "cancelled": self.cancelled_rows}

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop admitting, let running rows finish for up to `timeout` seconds, then cancel the rest."""
        with self._cond:
            self._stopping = True
            waiting, self._waiting = list(self._waiting), collections.deque()
            self._cond.notify()
        for request in waiting:
            _abort(request, "the server is shutting down", 503)
        self._thread.join(timeout)
        with self._cond:
            unfinished = {id(r.request): r.request for r in self._rows}.values()
            for request in unfinished:
                request.cancel()
        self._thread.join(5.0)
        for request in unfinished:
            _abort(request, "the server shut down before this request finished", 503)

    # ---- scheduler thread ---------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._rows and not self._stopping and not self._calls:
                    self._cond.wait()
                self._run_calls()
                if self._stopping and not self._rows:
                    return
                admitted = self._admit()
                if not admitted and not self._rows:   # woken only for a load or unload
                    continue
            try:
                self._step(admitted)
            except Exception as e:  # a model failure must not kill the server: fail those requests
                log.exception("generation failed")
                self._fail_all(admitted, f"generation failed: {type(e).__name__}: {e}")

    def _run_calls(self) -> None:
        while self._calls:
            fn, future = self._calls.popleft()
            try:
                future.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                future.set_exception(e)

    def _admit(self) -> list[Request]:
        admitted, room = [], self.max_rows - len(self._rows)
        while self._waiting and not self._stopping:
            request = self._waiting[0]
            if request.cancelled.is_set():
                self._waiting.popleft()
                continue
            if request.params.n > room:
                break
            if request.adapter and self.adapters.slot_of(request.adapter) is None:   # unloaded while queued
                _abort(self._waiting.popleft(), f"the LoRA adapter '{request.adapter}' was unloaded "
                                                "before this request started", 404)
                continue
            admitted.append(self._waiting.popleft())
            room -= request.params.n
        return admitted

    def _step(self, admitted: list[Request]) -> None:
        import torch

        logits = None
        if self._rows:
            last = torch.tensor([r.last_token for r in self._rows], dtype=torch.long)
            slots = [r.slot for r in self._rows]
            self.mixed_steps += len(set(slots)) > 1
            with self._lora_rows(slots):
                logits = self._batch.decode(last)
        if admitted:
            # Prefill each prompt once; the request's n choices are copies of its row.
            slots = [self.adapters.slot_of(r.adapter) if r.adapter else 0 for r in admitted]
            copies = [k for k, req in enumerate(admitted) for _ in range(req.params.n)]
            with self._lora_rows(slots):
                new_logits = self._batch.admit([r.prompt_ids for r in admitted], copies,
                                               [r.vision for r in admitted])
            self._rows.extend(self._new_row(req, i, slot) for req, slot in zip(admitted, slots)
                              for i in range(req.params.n))
            logits = new_logits if logits is None else torch.cat([logits, new_logits], dim=0)
            self.peak_rows = max(self.peak_rows, len(self._rows))
        self._sample_and_emit(logits)

    def _new_batch(self):
        """An empty running batch on the rollout's runner: unpacked linears under LoRA slots (their
        hooks add each row's adapter), packed for max_rows rows otherwise."""
        from rlctl.serve.batch import LiveBatch

        return LiveBatch(self.model, pad_id=self.pad_id, context_length=self.context_length, rows_hint=self.max_rows,
                         pack=self.adapters is None, vision=self.processor is not None)

    def _lora_rows(self, slots: list[int]):
        return self.adapters.lora.rows(slots) if self.adapters is not None else contextlib.nullcontext()

    def _new_row(self, request: Request, choice: int, slot: int = 0) -> _Row:
        import torch

        p = request.params
        generator = None
        if p.seed is not None:
            generator = torch.Generator(device=self.model.device)
            generator.manual_seed(_row_seed(p.seed, choice))
        matcher = self._matcher(p.grammar) if p.grammar else None
        kept = ([], []) if request.token_ids else (None, None)
        return _Row(request, request.index_base + choice, TextStream(self._decode, p.stop), generator, matcher,
                    slot, *kept)

    def _matcher(self, spec: str):
        from rlctl.workers.rollout.grammar import GrammarCompiler, vocab_size_of

        with self.tokenizer_lock:
            if self._grammars is None:
                self._grammars = GrammarCompiler(self.tokenizer, vocab_size_of(self.model), self.eos_ids)
            return self._grammars.matcher(spec)

    def _decode(self, ids: list[int]) -> str:
        with self.tokenizer_lock:
            return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _sample_and_emit(self, logits) -> None:
        import torch

        from rlctl.serve.request_sampling import sample_next_tokens
        from rlctl.workers.rollout import grammar

        rows, device = self._rows, logits.device
        if self.banned:
            logits = logits.index_fill(-1, torch.tensor(self.banned, device=device), float("-inf"))
        matchers = [r.matcher for r in rows]
        logits = grammar.constrained(logits, matchers)
        params = [r.request.params for r in rows]
        tokens = sample_next_tokens(
            logits,
            torch.tensor([p.temperature for p in params], device=device),
            torch.tensor([p.top_p for p in params], device=device),
            torch.tensor([p.top_k for p in params], dtype=torch.long, device=device),
            [r.generator for r in rows], self._default_generator,
        ).tolist()
        grammar.accept(matchers, tokens)
        logprobs = _token_logprobs(logits, params, tokens) if any(r.ids is not None for r in rows) else None
        for b, (row, token) in enumerate(zip(rows, tokens)):
            self._advance(row, token, None if logprobs is None else logprobs[b])
        keep = [i for i, r in enumerate(rows) if not r.done]
        if len(keep) < len(rows):
            self._rows = [rows[i] for i in keep]
            if keep:
                self._batch.keep(keep)
            else:
                self._batch.clear()

    def _advance(self, row: _Row, token: int, logprob: float | None) -> None:
        """Append one sampled token to a row and tell its request what changed."""
        request = row.request
        if request.cancelled.is_set():
            row.done = True
            self.cancelled_rows += 1
            return
        row.tokens += 1
        row.last_token = token
        if row.ids is not None:
            row.ids.append(token)
            row.logprobs.append(logprob)
        finish, text = None, ""
        p = request.params
        if (token in self.eos_ids and not p.ignore_eos) or token in p.stop_token_ids:
            finish, text = "stop", row.stream.flush()
        else:
            text, stopped = row.stream.push(token)
            if stopped:
                finish = "stop"
            elif (row.tokens >= request.params.max_tokens
                  or len(request.prompt_ids) + row.tokens >= self.context_length):
                finish, text = "length", text + row.stream.flush()
        row.done = finish is not None
        if text or finish:
            kept = (row.ids, row.logprobs) if finish else (None, None)
            request.events.put(Event(row.index, text, row.tokens, finish, None, 500, *kept))

    def _fail_all(self, admitted: list[Request], message: str) -> None:
        failed = {id(r.request): r.request for r in self._rows}
        failed.update({id(r): r for r in admitted})
        for request in failed.values():
            _abort(request, message, 500)
        self._rows = []
        self._batch.clear()


def _abort(request: Request, message: str, status: int) -> None:
    """End every choice of `request` with an error its HTTP handler turns into `status`."""
    request.cancel()
    for i in range(request.params.n):
        request.events.put(Event(request.index_base + i, "", 0, "error", message, status))


def _token_logprobs(logits, params: list, tokens: list[int]) -> list[float]:
    """log softmax(logits / T) of each row's sampled token (T = 1 for a greedy row), as the rollout
    engine's rollout_log_prob: the distribution before top-k / top-p, after grammar masks."""
    import torch

    t = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params], device=logits.device)
    lp = torch.log_softmax(logits.float() / t[:, None], dim=-1)
    return lp.gather(1, torch.tensor(tokens, device=logits.device)[:, None]).squeeze(1).tolist()


def _eos_ids(model, tokenizer) -> tuple[int, ...]:
    """Token ids that end a response: the generation config's eos list plus the tokenizer's eos."""
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids = [] if ids is None else ([ids] if isinstance(ids, int) else list(ids))
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return tuple(dict.fromkeys(ids))
