"""An agent episode's model calls, and the training sequences they become.

Every call the endpoint answers is recorded as the exact token ids the policy saw (the rendered
prompt) and sampled (the completion), with the engine's log-prob of each sampled token. Calls
chain into sequences by one rule, decided when a call arrives (so the endpoint can keep every
sequence within one training row):

    a call whose prompt tokens begin with the previous call's prompt + completion tokens continues
    that call's sequence: the tokens in between (a tool result, a user turn, the template's glue)
    join it with response_mask 0, the completion with response_mask 1;
    any other call (the agent rewrote or trimmed its history, or its re-rendered text tokenised
    differently) starts a sequence of its own.

Never is a history re-tokenised and trained with log-probs that were not the sampled ones.
A sequence's budget is the run's: its first prompt's tokens (up to data.max_prompt_length sit in
the row's prompt part) + data.max_response_length for everything after them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CONTEXT_LENGTH = "context_length_exceeded"   # the endpoint's 400 for a call that cannot fit its sequence


@dataclass
class Call:
    prompt_ids: list[int]
    completion_ids: list[int]
    log_probs: list[float]          # the engine's log-prob of each completion token
    finish: str                     # "stop" | "length"
    merged: bool                    # continued the previous call's sequence


@dataclass
class Sequence:
    """One training row: prompt_ids, then response_ids with response_mask (1 = sampled) and
    log_probs (0 where not sampled)."""

    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def extend(self, context: list[int], call: Call) -> None:
        self.response_ids += context + call.completion_ids
        self.response_mask += [0] * len(context) + [1] * len(call.completion_ids)
        self.log_probs += [0.0] * len(context) + list(call.log_probs)


@dataclass
class Episode:
    """One run of the agent on one row (`index`: its place in the rollout, prompt-major)."""

    index: int
    row: dict
    calls: list[Call] = field(default_factory=list)
    sequences: list[Sequence] = field(default_factory=list)
    reward: float | None = None
    metrics: dict = field(default_factory=dict)
    failure: str = ""               # why it failed ("" = it did not): raised, timeout, max_calls, no reward, ...
    refused: str = ""               # the code of the endpoint's last refusal of one of its calls (a 400's)
    answer: str = ""                # the last completion's text (what a scorer reads)

    def continues(self, prompt_ids: list[int]) -> bool:
        """The merge rule: the prompt begins with the last call's prompt + completion."""
        if not self.sequences:
            return False
        last = self.sequences[-1].tokens
        return len(prompt_ids) >= len(last) and prompt_ids[:len(last)] == last

    def budget(self, prompt_ids: list[int], prompt_length: int, response_length: int) -> int:
        """Tokens this call may sample so that its sequence still fits one row (<= 0: it cannot)."""
        start = len(self.sequences[-1].prompt_ids) if self.continues(prompt_ids) else len(prompt_ids)
        return min(start, prompt_length) + response_length - len(prompt_ids)

    def record(self, call: Call) -> None:
        if call.merged:
            seq = self.sequences[-1]
            seq.extend(call.prompt_ids[len(seq.tokens):], call)
        else:
            seq = Sequence(prompt_ids=list(call.prompt_ids))
            seq.extend([], call)
            self.sequences.append(seq)
        self.calls.append(call)


def layout(seq: Sequence, prompt_length: int) -> tuple[list[int], list[int], list[int], list[float]]:
    """A sequence as (prompt part, response part, response mask, log-probs) for a row whose prompt part
    holds at most `prompt_length` tokens: a longer prompt's tail moves to the response part, masked 0
    (it is context, as a tool result is), so every sequence the endpoint let through fits one row."""
    cut = min(len(seq.prompt_ids), prompt_length)
    tail = seq.prompt_ids[cut:]
    return (seq.prompt_ids[:cut], tail + seq.response_ids, [0] * len(tail) + seq.response_mask,
            [0.0] * len(tail) + seq.log_probs)
