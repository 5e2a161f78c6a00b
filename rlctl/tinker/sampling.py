"""Sampling for Tinker's SamplingClient on rlctl's built-in serving engine, and prompt log-probs.

Each base model has one engine (rlctl.serve.engine: continuous batching on its own scheduler
thread) over a second module tree that shares the base's weight tensors, so training clients'
peft adapters never show in it. A sampler is the base model plus, for trained weights, an adapter
in one of the engine's slots: a snapshot copied from a training client
(save_weights_and_get_sampling_client) or read from a saved path, so training on never changes
what an existing sampling client samples from. Concurrent sample requests of different samplers
on one base decode in one batch, each row with its own adapter (rlctl.models.lora_slots: one
gathered LoRA matmul per layer).
"""

from __future__ import annotations

import copy
import itertools
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch

from rlctl.api.requests import Event, Request, SamplingParams
from rlctl.tinker.wire import TinkerError

DEFAULT_MAX_TOKENS = 16        # when SamplingParams.max_tokens is None (OpenAI completions' default)
SAMPLE_ROWS = 64               # rows one engine step decodes at most; a request's num_samples fits in it
MAX_RANK = 1 << 16             # no ceiling of our own: the slot stacks grow to the largest rank held


@dataclass
class Sampler:
    sampler_id: str
    base: object                   # rlctl.tinker.base.BaseModel
    adapter: str                   # its engine adapter's name; "" = the plain base model
    model_path: str | None = None


def start_engine(model, tokenizer, name: str, slots: int):
    """The sampling engine of a base model: over a copy of `model`'s modules that shares every
    parameter and buffer (no weights are copied), taken before peft wraps `model` for training."""
    from rlctl.serve.adapters import ServedAdapters
    from rlctl.serve.engine import Engine

    shared = {id(t): t for t in itertools.chain(model.parameters(), model.buffers())}
    view = copy.deepcopy(model, memo=shared)
    return Engine(view, tokenizer, max_rows=SAMPLE_ROWS, adapters=ServedAdapters(view, name, slots=slots,
                                                                                 max_rank=MAX_RANK))


def parse_params(raw: dict, base, prompt_len: int, n: int) -> SamplingParams:
    """Tinker's SamplingParams as the engine's. `stop`: strings end a sequence where their text
    appears (EOS still does); token ids end it on those ids only; `[]` runs to max_tokens."""
    stop = raw.get("stop")
    strs: tuple[str, ...] = ()
    ids: tuple[int, ...] = ()
    if isinstance(stop, str):
        strs = (stop,)
    elif isinstance(stop, list) and stop:
        if all(isinstance(s, int) for s in stop):
            ids = tuple(stop)
        elif all(isinstance(s, str) for s in stop):
            strs = tuple(stop)
        else:
            raise TinkerError("sampling_params.stop is a list of strings or a list of token ids, not a mix")
    max_tokens = raw.get("max_tokens") or DEFAULT_MAX_TOKENS
    room = base.max_context - prompt_len
    if max_tokens < 1 or max_tokens > room:
        raise TinkerError(f"max_tokens {max_tokens} does not fit: the prompt has {prompt_len} tokens and "
                          f"{base.name} takes {base.max_context} in all")
    temperature, top_p, top_k = float(raw.get("temperature", 1.0)), float(raw.get("top_p", 1.0)), int(raw.get("top_k", -1))
    if temperature < 0 or not 0 < top_p <= 1 or top_k == 0 or top_k < -1:
        raise TinkerError("sampling_params: temperature >= 0, 0 < top_p <= 1, top_k -1 (off) or >= 1")
    if not 1 <= n <= SAMPLE_ROWS:
        raise TinkerError(f"num_samples {n}: rlctl tinker samples 1 to {SAMPLE_ROWS} sequences per request "
                          "(send several requests for more)")
    seed = raw.get("seed")
    return SamplingParams(int(max_tokens), temperature, top_p, 0 if top_k == -1 else top_k, n, strs,
                          None if seed is None else int(seed), ignore_eos=stop == [] or bool(ids), stop_token_ids=ids)


def submit(sampler: Sampler, prompt: list[int], params: SamplingParams,
           done: Callable[[list[Event]], None]) -> None:
    """Queue the request on the base's engine; `done(last events, by choice)` runs once all ended."""
    request = Request(list(prompt), params, _Collect(params.n, done), adapter=sampler.adapter, token_ids=True)
    if not sampler.base.engine.submit(request):
        raise TinkerError("the sampling queue is full: retry shortly", status=429)


class _Collect:
    """A Request's `events` (the engine only calls put): keeps each choice's last event and calls
    `done` once every choice has ended. Runs on the engine's scheduler thread."""

    def __init__(self, n: int, done: Callable[[list[Event]], None]):
        self._n, self._done, self._ended, self._lock = n, done, {}, threading.Lock()

    def put(self, event: Event) -> None:
        if event.finish_reason is None:
            return
        with self._lock:
            if event.index in self._ended:
                return
            self._ended[event.index] = event
            finished = len(self._ended) == self._n
        if finished:
            self._done([self._ended[i] for i in sorted(self._ended)])


def sequences_of(events: list[Event]) -> list[dict]:
    """{"tokens", "logprobs" (log softmax(logits / T) of each sampled token), "stop"} per choice."""
    return [{"tokens": e.token_ids or [], "logprobs": e.logprobs or [], "stop": e.finish_reason == "stop"}
            for e in events]


def prompt_logprobs(sampler: Sampler, prompt: list[int]) -> np.ndarray:
    """log p(prompt[i] | prompt[:i]) for i >= 1; NaN at position 0, which has no context. One
    forward on the engine's thread, between two decode steps, with the sampler's adapter slot."""
    if len(prompt) < 2:
        return np.full(len(prompt), np.nan, dtype=np.float32)
    ids = torch.tensor(prompt, dtype=torch.long)
    engine, base = sampler.base.engine, sampler.base

    def forward() -> np.ndarray:
        slot = engine.adapters.slot_of(sampler.adapter) if sampler.adapter else 0
        if slot is None:
            raise TinkerError(f"sampling session {sampler.sampler_id!r} was evicted while this request waited", status=404)
        with engine.adapters.lora.rows([slot]), torch.no_grad():
            return base.target_log_probs(engine.model, [ids[:-1]], [ids[1:]])[0].numpy()
    return np.concatenate([[np.nan], engine.call(forward)]).astype(np.float32)
