"""What an OpenAI-compatible HTTP front hands an engine and gets back: a request's sampling
parameters, the request (its prompt ids and the queue its events go to) and one event of one
choice. The built-in engine (rlctl.serve.engine) and the agent endpoint's engine
(rlctl.agent.engine) both take `Request`s from rlctl.api.http and answer with `Event`s.
"""

from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    n: int = 1
    stop: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False  # vLLM extension: keep going past EOS (benchmarks, fixed-length tests)
    grammar: str | None = None  # decode under this grammar spec (rlctl.workers.rollout.grammar)
    stop_token_ids: tuple[int, ...] = ()  # vLLM's: these ids end a choice too (with ignore_eos: only these)


@dataclass
class Event:
    """One step of one choice: new text, tokens generated so far, and why it ended (if it did)."""

    index: int
    text: str
    completion_tokens: int
    finish_reason: str | None = None  # "stop" | "length" | "error"
    error: str | None = None
    status: int = 500  # HTTP status for an error: 500 engine failure, 503 shutting down
    # with Request.token_ids, a choice's last event: its token ids and each one's log-prob under the
    # distribution it was drawn from (log softmax(logits / T), T = 1 when greedy; before top-k/top-p)
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None


@dataclass
class Request:
    prompt_ids: list[int]
    params: SamplingParams
    events: queue.Queue
    index_base: int = 0  # choice index of this request's first row (batched completion prompts)
    vision: dict | None = None  # a VLM prompt's image arrays (rlctl.models.vision.encode_prompt)
    tag: str = ""  # the caller its path named (OpenAIServer.scope): the agent endpoint's episode
    adapter: str = ""  # the LoRA adapter the request's `model` named ("" = the base model)
    token_ids: bool = False  # the last event of each choice carries its tokens and log-probs (Event)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self.cancelled.set()


class ServingEngine(Protocol):
    """What rlctl.api.http.OpenAIServer and rlctl.api.protocol read of an engine. `submit` is called
    from HTTP threads and must be thread-safe; the engine answers each Request on its `events` queue."""

    tokenizer: Any
    context_length: int   # prompt + completion tokens a request may have (GET /v1/models: max_model_len)
    max_rows: int         # most choices (n) one request may ask for
    stopping: bool

    def load(self) -> dict: ...

    def submit(self, request: Request) -> bool: ...

    def encode(self, text: str) -> list[int]: ...

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]: ...
