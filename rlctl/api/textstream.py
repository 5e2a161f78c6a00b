"""Token ids -> text deltas for streaming, with stop strings.

Decoding one token at a time is wrong for byte-level tokenizers (a UTF-8 character can span
tokens) and decoding the whole sequence each step is O(T^2), so we decode a short window: the
text of ids[prefix:] minus the text of ids[prefix:read] is the new text once it no longer ends
in U+FFFD (an incomplete character). Text that might be the start of a stop string is held back
until it either completes the stop string (cut there) or cannot anymore (released).
"""

from __future__ import annotations

from typing import Callable


class TextStream:
    """Accumulates one choice's text; `push` returns (delta, stopped_by_stop_string)."""

    def __init__(self, decode: Callable[[list[int]], str], stop: tuple[str, ...] = ()):
        self._decode = decode
        self._stop = tuple(s for s in stop if s)
        self._ids: list[int] = []
        self._prefix = 0  # first id of the decode window
        self._read = 0  # ids up to here are already in `text`
        self.text = ""  # decoded so far (possibly cut at a stop string)
        self._sent = 0  # characters of `text` already handed out

    def push(self, token_id: int) -> tuple[str, bool]:
        self._ids.append(token_id)
        before = self._decode(self._ids[self._prefix:self._read])
        after = self._decode(self._ids[self._prefix:])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self.text += after[len(before):]
            self._prefix, self._read = self._read, len(self._ids)
        return self._release()

    def flush(self) -> str:
        """The rest of the text when generation ends (incomplete characters included)."""
        tail = self._decode(self._ids[self._prefix:])
        head = self._decode(self._ids[self._prefix:self._read])
        self.text += tail[len(head):]
        self._read = len(self._ids)
        cut = self._find_stop()
        if cut is not None:
            self.text = self.text[:cut]
        delta, self._sent = self.text[self._sent:], len(self.text)
        return delta

    def _find_stop(self) -> int | None:
        """Index of the earliest complete stop string in the unsent tail, if any."""
        longest = max((len(s) for s in self._stop), default=0)
        start = max(0, self._sent - longest)
        hits = [i for i in (self.text.find(s, start) for s in self._stop) if i >= 0]
        return min(hits) if hits else None

    def _release(self) -> tuple[str, bool]:
        cut = self._find_stop()
        if cut is not None:
            self.text = self.text[:cut]
            delta, self._sent = self.text[self._sent:], len(self.text)
            return delta, True
        safe = len(self.text)
        # Hold back the longest tail that is a proper prefix of some stop string.
        for k in range(min(max((len(s) for s in self._stop), default=1) - 1, safe - self._sent), 0, -1):
            tail = self.text[safe - k:]
            if any(s.startswith(tail) for s in self._stop):
                safe -= k
                break
        delta, self._sent = self.text[self._sent:safe], safe
        return delta, False
