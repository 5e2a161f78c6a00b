"""The agent endpoint's engine: the policy behind rlctl.api.http's OpenAI front, batching the calls
of concurrent episodes into the rollout workers and recording every token.

HTTP threads `submit` requests (chat completions) or call `generate_ids` (vLLM's token endpoint);
one scheduler thread takes what is waiting and generates it in one `generate_turn` on the policy's
ranks, as a serving engine batches. It generates when every running episode is waiting on the
model, or once the oldest waiting call has waited `max_wait_s`: with agents that answer between
their calls within that time, the same episodes batch the same way every time, so a seeded run
samples the same tokens again (exact resume). Each call's budget comes from its episode
(rlctl.agent.episodes): a call that cannot fit is a 400 (context_length_exceeded), one past
`max_calls` (counting the episode's calls still waiting or being generated) a 429 that also fails the
episode; both reach the agent as the OpenAI client's errors. A call belongs to its episode while the
episode runs: when the episode ends (or times out) its waiting calls are answered 410 and dropped, and
one being generated then is answered 410 and not recorded.

Sampling follows the run (rollout.temperature / top_p / top_k in training, val_temperature in
validation and eval): the trainer's log-probs assume those, so a request's own temperature or
top_p is accepted and not applied. Its max_tokens and stop strings are applied, and so are a forced
tool_choice and a JSON response_format: the call is decoded under their grammar on the ranks
(rlctl.workers.rollout.grammar), its recorded log-probs those of the masked distribution it was
drawn from (docs/agents.md).
"""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from rlctl.agent.episodes import CONTEXT_LENGTH, Call, Episode
from rlctl.api import protocol
from rlctl.api.api_error import APIError
from rlctl.api.requests import Event, Request, SamplingParams
from rlctl.api.textstream import TextStream
from rlctl.data.dataset import chat_prompt_ids
from rlctl.runtime.batch import Batch, object_array


@dataclass
class _Waiting:
    request: Request
    episode: Episode
    since: float
    call: Call | None = None
    text: str = ""


@dataclass
class EngineLimits:
    prompt_length: int     # data.max_prompt_length: a sequence's first prompt part
    response_length: int   # data.max_response_length: everything after it
    max_calls: int
    max_wait_s: float


@dataclass
class _Flush:
    waiting: list[_Waiting]
    limits: list[int] = field(default_factory=list)
    merged: list[bool] = field(default_factory=list)


class AgentEngine:
    """rlctl.api.requests.ServingEngine over a TurnGenerator (the actor group, or LocalTurns in eval)."""

    max_rows = 1   # n > 1 is a 400: each call is one sample; rollout.n episodes make the group

    def __init__(self, turns, tokenizer, *, limits: EngineLimits, eos_ids: list[int], pad_id: int):
        self.turns, self.tokenizer, self.limits = turns, tokenizer, limits
        self.context_length = limits.prompt_length + limits.response_length
        self.eos_ids, self.pad_id = set(int(e) for e in eos_ids), int(pad_id)
        self.tokenizer_lock = threading.Lock()
        self.lock = threading.Condition()
        self.stopping = False
        self._episodes: dict[str, Episode] = {}
        self._waiting: list[_Waiting] = []
        self._generating: list[_Waiting] = []   # the flush being sampled, until each call is answered
        self.vocab_size = vocab_size(tokenizer)
        self._mode, self._seed, self._flushes = "train", 0, 0
        self.generated_calls = 0
        self.error: Exception | None = None   # a generation that raised: the rollout re-raises it
        self._thread = threading.Thread(target=self._loop, name="rlctl-agent-engine", daemon=True)
        self._thread.start()

    # --- the episodes' lifecycle (the runner's thread) -------------------------------------------
    def begin(self, *, seed: int, mode: str) -> None:
        """A new rollout: its seed (each generation's is derived from it in order) and mode."""
        with self.lock:
            self._mode, self._seed, self._flushes = mode, int(seed), 0

    def open(self, tag: str, episode: Episode) -> None:
        """Call under `lock` together with the close it replaces, so no batch forms in between."""
        self._episodes[tag] = episode
        self.lock.notify_all()

    def close(self, tag: str) -> None:
        """Under `lock`: the episode ends; its calls still waiting are refused, never generated."""
        self._episodes.pop(tag, None)
        for w in self._waiting:
            if w.request.tag == tag:
                _refuse(w.request, 410, ENDED)
        self._waiting = [w for w in self._waiting if w.request.tag != tag]
        self.lock.notify_all()

    def note_refusal(self, tag: str, code: str) -> None:
        """A call of the episode `tag` was refused with `code` before it reached the engine."""
        with self.lock:
            if tag in self._episodes:
                self._episodes[tag].refused = code

    def live(self, tag: str) -> bool:
        with self.lock:
            return tag in self._episodes

    def stop(self) -> None:
        with self.lock:
            self.stopping = True
            self.lock.notify_all()
        self._thread.join(5.0)

    # --- called from HTTP threads --------------------------------------------------------------------
    def load(self) -> dict:
        with self.lock:
            return {"episodes": len(self._episodes), "waiting": len(self._waiting)}

    def encode(self, text: str) -> list[int]:
        with self.tokenizer_lock:
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def encode_chat(self, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
        with self.tokenizer_lock:
            return chat_prompt_ids(messages, self.tokenizer, tools)

    def submit(self, request: Request) -> bool:
        with self.lock:
            if self.stopping:
                return False
            episode = self._episodes.get(request.tag)
            if episode is None:
                _refuse(request, 410, ENDED)
            elif self._calls_of(episode) >= self.limits.max_calls:
                episode.failure = episode.failure or "max_calls"
                _refuse(request, 429, f"this episode made rollout.agent.max_calls = {self.limits.max_calls} calls")
            else:
                self._waiting.append(_Waiting(request, episode, time.monotonic()))
                self.lock.notify_all()
        return True

    def _calls_of(self, episode: Episode) -> int:
        """Under `lock`: the episode's calls answered, waiting and being generated (what max_calls counts)."""
        return len(episode.calls) + sum(w.episode is episode for w in (*self._waiting, *self._generating))

    def generate_ids(self, body: dict, tag: str) -> dict:
        """vLLM's POST /inference/v1/generate, in vLLM's own shape (what verifiers' train client, through the
        `renderers` package, sends and parses): {"token_ids": [...], "sampling_params": {"max_tokens", "stop",
        "stop_token_ids", ...}} in; {"request_id", "choices": [{"token_ids", "logprobs": {"content": [{"token":
        "token_id:<id>", "logprob"}]}, "finish_reason"}]} out. stop_token_ids end a completion as EOS does."""
        request = parse_generate(body, self.vocab_size, self.context_length, tag)
        self.submit(request)
        event = request.events.get()
        if event.error:
            raise APIError(event.status, event.error, type="server_error" if event.status >= 500 else
                           "invalid_request_error")
        call = event.call
        content = [{"token": f"token_id:{t}", "logprob": lp} for t, lp in zip(call.completion_ids, call.log_probs)]
        return {"request_id": f"{tag}-{len(call.prompt_ids)}", "choices": [
            {"index": 0, "token_ids": call.completion_ids, "logprobs": {"content": content},
             "finish_reason": call.finish, "text": event.text}]}

    # --- the scheduler thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self.lock:
                flush = self._next_flush()
                if flush is None:
                    return
            try:
                self._generate(flush)
            except Exception as e:   # the step fails with it (the runner re-raises); agents see a 500
                self.error = e
                for w in flush.waiting:
                    _refuse(w.request, 500, f"generation failed: {type(e).__name__}: {e}")

    def _next_flush(self) -> _Flush | None:
        """Wait (under lock) until a batch should form; take it, in episode order."""
        while True:
            if self.stopping:
                for w in self._waiting:
                    _refuse(w.request, 503, "the rollout is over")
                self._waiting = []
                return None
            self._generating = []   # the last flush is answered
            live = [w for w in self._waiting if not w.request.cancelled.is_set()]
            self._waiting = live
            if live:
                waiting_on = {id(w.episode) for w in live}
                everyone = all(id(e) in waiting_on for e in self._episodes.values())
                left = self.limits.max_wait_s - (time.monotonic() - min(w.since for w in live))
                if everyone or left <= 0:
                    self._waiting, self._generating = [], live
                    return _Flush(sorted(live, key=lambda w: (w.episode.index, w.since)))
                self.lock.wait(timeout=left)
            else:
                self.lock.wait()

    def _generate(self, flush: _Flush) -> None:
        lim = self.limits
        ready = []
        with self.lock:   # an episode that ended since the flush formed: its call is not generated
            flush.waiting = [w for w in flush.waiting if self._answerable(w)]
        for w in flush.waiting:
            budget = w.episode.budget(w.request.prompt_ids, lim.prompt_length, lim.response_length)
            if budget < 1:
                w.episode.refused = CONTEXT_LENGTH   # an episode that then fails is told which keys to raise
                _refuse(w.request, 400, f"this call's prompt has {len(w.request.prompt_ids)} tokens and leaves no "
                                        f"room in its sequence (data.max_prompt_length {lim.prompt_length} + "
                                        f"data.max_response_length {lim.response_length}): shorten the history",
                        code=CONTEXT_LENGTH)
                with self.lock:
                    self._settle(w)
                continue
            flush.limits.append(min(w.request.params.max_tokens, budget))
            flush.merged.append(w.episode.continues(w.request.prompt_ids))
            ready.append(w)
        if not ready:
            return
        out = self._sample([w.request.prompt_ids for w in ready], flush.limits,
                           [w.request.params.grammar or "" for w in ready])
        for j, (w, merged) in enumerate(zip(ready, flush.merged)):
            length = int(out["response_length"][j])
            ids = out["responses"][j, :length].tolist()
            lps = out["rollout_log_prob"][j, :length].tolist()
            ids, lps, text, finish = self._finish(ids, lps, bool(out["truncated"][j]), w.request.params.stop,
                                                  getattr(w.request, "stop_ids", frozenset()))
            call = Call(list(w.request.prompt_ids), ids, lps, finish,
                        merged=merged and w.episode.continues(w.request.prompt_ids))
            with self.lock:
                if not self._answerable(w):   # its episode ended while it was sampled: not recorded
                    continue
                w.episode.record(call)
                w.episode.answer = text
                self._settle(w)
            self.generated_calls += 1
            w.request.events.put(_CallEvent(0, text, len(ids), finish, call=call))

    def _answerable(self, w: _Waiting) -> bool:
        """Under `lock`: whether the call's episode still runs; if not, the call is refused."""
        if self._episodes.get(w.request.tag) is w.episode:
            return True
        _refuse(w.request, 410, ENDED)
        self._settle(w)
        return False

    def _settle(self, w: _Waiting) -> None:
        """Under `lock`: the call is answered; it no longer counts as being generated."""
        self._generating = [g for g in self._generating if g is not w]

    def _sample(self, prompts: list[list[int]], limits: list[int], grammars: list[str]) -> dict:
        """One generate_turn over every rank: rows padded to a multiple of the world (dummy rows of one
        token, dropped again); returns the real rows' columns. When the calls come in runs of k equal
        (prompt, limit, grammar), as the first calls of a prompt's rollout.n episodes do, each run is one
        input with n = k samples: its prefill is shared, as in the built-in single-turn rollout. A call
        with a forced tool_choice or a JSON response_format carries its grammar spec in the `grammar`
        column ("" = none; the column only when some call has one)."""
        k = _runs_of_equal([(p, g) for p, g in zip(prompts, grammars)], limits)
        prompts, limits, grammars = prompts[::k], limits[::k], grammars[::k]
        world = self.turns.world_size
        rows = len(prompts) * k
        padded = prompts + [[self.pad_id]] * (-len(prompts) % world)
        caps = limits + [1] * (-len(prompts) % world)
        width = max(len(p) for p in padded)
        ids = np.full((len(padded), width), self.pad_id, dtype=np.int64)
        mask = np.zeros_like(ids)
        for r, p in enumerate(padded):
            ids[r, width - len(p):], mask[r, width - len(p):] = p, 1
        with self.lock:
            seed = int(np.random.SeedSequence([self._seed, self._flushes]).generate_state(1)[0])
            self._flushes += 1
            mode = self._mode
        columns = {"input_ids": ids, "attention_mask": mask, "max_new_tokens": np.asarray(caps, dtype=np.int64)}
        if any(grammars):
            columns["grammar"] = object_array(grammars + [""] * (-len(prompts) % world))
        batch = Batch(columns)
        out = self.turns.generate_turn(batch, seed=seed, mode=mode, n=k, width=max(caps), log_probs=True)
        return {k: out[k][:rows] for k in ("responses", "response_length", "truncated", "rollout_log_prob")}

    def _finish(self, ids: list[int], lps: list[float], truncated: bool, stop: tuple,
                stop_ids: frozenset = frozenset()) -> tuple:
        """(tokens, log-probs, text, finish_reason): the completion cut after the token that completes a
        stop string (the text before it is the answer), the EOS kept in the tokens, not in the text."""
        stream = TextStream(self._decode, stop)
        for k, token in enumerate(ids):
            if token in self.eos_ids or token in stop_ids:
                stream.flush()
                return ids[:k + 1], lps[:k + 1], stream.text, "stop"
            _, stopped = stream.push(token)
            if stopped:
                return ids[:k + 1], lps[:k + 1], stream.text, "stop"
        stream.flush()
        return ids, lps, stream.text, "length" if truncated else "stop"

    def _decode(self, ids: list[int]) -> str:
        with self.tokenizer_lock:
            return self.tokenizer.decode(ids, skip_special_tokens=True)


def parse_generate(body: dict, vocab: int, context: int, tag: str) -> Request:
    """The token endpoint's body checked as rlctl.api.protocol checks the OpenAI routes' (a bad field is
    a 400 to that call alone): token ids and stop_token_ids within the model's vocabulary, stop strings
    as the chat route takes them, max_tokens a positive integer (default: the rest of the context)."""
    ids = protocol.token_ids(body.get("token_ids"), vocab, "token_ids")
    sp = body.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise APIError(400, "'sampling_params' must be an object", param="sampling_params")
    if len(ids) >= context:
        raise APIError(400, f"This model's maximum context length is {context} tokens, but the prompt has "
                            f"{len(ids)}; shorten the prompt", param="token_ids", code="context_length_exceeded")
    max_tokens = sp.get("max_tokens")
    max_tokens = context - len(ids) if max_tokens is None else max_tokens
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise APIError(400, "'sampling_params.max_tokens' must be a positive integer", param="sampling_params")
    stop = protocol.stop_strings(sp.get("stop"), "sampling_params.stop")
    stop_ids = sp.get("stop_token_ids") or []
    stop_ids = protocol.token_ids(stop_ids, vocab, "sampling_params.stop_token_ids") if stop_ids else []
    request = Request(ids, SamplingParams(max_tokens=max_tokens, stop=stop), queue.Queue(), tag=tag)
    request.stop_ids = frozenset(stop_ids)   # read by _finish beside the run's EOS ids
    return request


def vocab_size(tokenizer) -> int:
    """Token ids the policy can take: its config's vocab_size (embedding rows, often padded past the
    tokenizer's ids, and a policy can sample any of them), at least the tokenizer's length."""
    config = Path(getattr(tokenizer, "name_or_path", "") or "") / "config.json"
    rows = 0
    if config.is_file():
        data = json.loads(config.read_text())
        rows = data.get("vocab_size") or (data.get("text_config") or {}).get("vocab_size") or 0
    return max(int(rows), len(tokenizer))


def _runs_of_equal(prompts: list, limits: list[int]) -> int:
    """k when the calls are consecutive runs of k equal (prompt, limit) pairs, all of one length, else 1."""
    runs, start = [], 0
    for i in range(1, len(prompts) + 1):
        if i == len(prompts) or prompts[i] != prompts[start] or limits[i] != limits[start]:
            runs.append(i - start)
            start = i
    return runs[0] if len(set(runs)) == 1 else 1


@dataclass
class _CallEvent(Event):
    call: Call | None = None   # the recorded call, for the token endpoint's answer


ENDED = "this episode has ended; its endpoint takes no more calls"


def _refuse(request: Request, status: int, message: str, code: str | None = None) -> None:
    request.cancel()
    request.events.put(Event(request.index_base, "", 0, "error", message, status))
