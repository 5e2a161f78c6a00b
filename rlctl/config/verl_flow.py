"""The `if` / `case` blocks of a verl launch script, followed as bash would where the condition can be read.

verl's scripts choose their settings by branch: `if [ "$backend" = "megatron" ]; then ... else ...
fi`, `case "$ENGINE" in vllm) ...;; sglang) ...;; esac`. A branch whose condition compares words
that expand to known values (`=`, `==`, `!=`, `-eq` ... `-ge`, `-z`, `-n`, globs in `[[ ]]` and
case patterns) is taken or skipped as bash would; a condition rlctl cannot read (a command's exit
status, `-f FILE`, `&&`) counts as taken, so its assignments still apply (the last one wins).
"""

from __future__ import annotations

import fnmatch
import re
import shlex
from dataclasses import dataclass

_IF = re.compile(r"^(if|elif)\s+(.*?)\s*;?\s*then\b\s*(.*)$", re.DOTALL)
_IF_OPEN = re.compile(r"^(if|elif)\s+(.*?)\s*;?\s*$", re.DOTALL)     # `then` on the next line
_CASE = re.compile(r"^case\s+(.+?)\s+in\b\s*(.*)$", re.DOTALL)
_PATTERN = re.compile(r"^\(?\s*([^()=\s][^()]*?)\s*\)\s*(.*)$", re.DOTALL)
_NUMERIC = {"-eq": lambda a, b: a == b, "-ne": lambda a, b: a != b, "-lt": lambda a, b: a < b,
            "-le": lambda a, b: a <= b, "-gt": lambda a, b: a > b, "-ge": lambda a, b: a >= b}


@dataclass
class _Frame:
    kind: str            # "if" or "case"
    active: bool         # the current branch runs
    done: bool = False   # a branch known to hold has run (later elif / else / patterns are skipped)
    word: str = ""       # case: the word the patterns match
    known: bool = True   # every condition read so far could be evaluated


def condition(words: list[str]) -> bool | None:
    """`[ A = B ]`, `[[ A == glob ]]`, `test -z A`, ...: True/False, or None when rlctl cannot tell."""
    if words and words[0] == "test":
        words = ["[", *words[1:], "]"]
    if len(words) < 2 or (words[0], words[-1]) not in (("[", "]"), ("[[", "]]")):
        return None
    inner, glob = words[1:-1], words[0] == "[["
    if len(inner) == 1:
        return inner[0] != ""
    if len(inner) == 2 and inner[0] in ("-z", "-n"):
        return (inner[1] == "") == (inner[0] == "-z")
    if len(inner) != 3:
        return None
    left, op, right = inner
    if op in ("=", "=="):
        return fnmatch.fnmatchcase(left, right) if glob else left == right
    if op == "!=":
        return not (fnmatch.fnmatchcase(left, right) if glob else left == right)
    if op in _NUMERIC:
        try:
            return _NUMERIC[op](int(left), int(right))
        except ValueError:
            return None
    return None


class Flow:
    """Which lines of a script run: feed each logical line to `line`, which returns the command
    text to read (maybe "") or None when the line is skipped."""

    def __init__(self, words_of):
        self.frames: list[_Frame] = []
        self.words_of = words_of   # expands a condition's text into words (the script's variables)
        self.pending_if: str | None = None
        self.closing = False   # the last line ended its block (`...; fi`): popped before the next line

    def active(self) -> bool:
        return all(f.active for f in self.frames)

    def certain(self) -> bool:
        """The current line runs for sure (no enclosing condition was guessed): an `exit` here is bash's."""
        return all(f.active and f.known for f in self.frames)

    def line(self, text: str) -> str | None:
        if self.closing:
            self.closing = False
            if self.frames:
                self.frames.pop()
        stripped = text.strip()
        if self.pending_if is not None and re.match(r"^then\b", stripped):
            kind, self.pending_if = self.pending_if, None
            return self.line(f"{kind}; then {stripped[4:]}")
        head = stripped.split(None, 1)[0] if stripped else ""
        if head in ("if", "elif"):
            return self._if(stripped)
        if head == "else" or stripped.startswith("else;"):
            return self._else(stripped[4:].lstrip(" ;"))
        if re.match(r"^fi\b", stripped):
            if self.frames and self.frames[-1].kind == "if":
                self.frames.pop()
            return None
        if head == "case":
            return self._case(stripped)
        if re.match(r"^esac\b", stripped):
            if self.frames and self.frames[-1].kind == "case":
                self.frames.pop()
            return None
        if self.frames and self.frames[-1].kind == "case":
            return self._case_body(stripped)
        if re.search(r";\s*fi$", stripped) and self.frames:   # `a=1; fi` closing a one-line body
            self.closing = True   # the caller may still ask certain() about this body
            return re.sub(r";\s*fi$", "", stripped) if self.active() else None
        return stripped if self.active() else None

    def _if(self, text: str) -> str | None:
        m = _IF.match(text)
        if not m:
            opened = _IF_OPEN.match(text)
            if opened:   # `if [ ... ]` with `then` on its own line
                self.pending_if = f"{opened.group(1)} {opened.group(2)}"
            return None
        kind, cond, rest = m.groups()
        if kind == "if":
            parent = self.active()
            self.frames.append(_Frame("if", active=False, done=not parent))
        elif not self.frames or self.frames[-1].kind != "if":
            return None
        frame = self.frames[-1]
        if frame.done:
            frame.active = False
        else:
            held = condition(self.words_of(cond.strip()))
            frame.active = held is not False
            frame.done = held is True
            frame.known = frame.known and held is not None
        return self.line(rest) if rest.strip() else None

    def _else(self, rest: str) -> str | None:
        if self.frames and self.frames[-1].kind == "if":
            frame = self.frames[-1]
            frame.active, frame.done = not frame.done, True
        return self.line(rest) if rest.strip() else None

    def _case(self, text: str) -> str | None:
        m = _CASE.match(text)
        parent = self.active()
        words = self.words_of(m.group(1)) if m else []
        self.frames.append(_Frame("case", active=False, done=not parent, word=words[0] if len(words) == 1 else ""))
        return self.line(m.group(2)) if m and m.group(2).strip() else None

    def _case_body(self, text: str) -> str | None:
        frame, ends = self.frames[-1], text.endswith(";;")
        body = text[:-2].rstrip() if ends else text
        m = _PATTERN.match(body)
        if m and not re.match(r"^[A-Za-z_]\w*\+?=", body):   # `pattern)` starts a branch
            patterns = [p.strip().strip("\"'") for p in m.group(1).split("|")]
            frame.active = not frame.done and any(fnmatch.fnmatchcase(frame.word, p) for p in patterns)
            frame.done = frame.done or frame.active
            body = m.group(2)
        run = self.active() and body.strip()
        if ends:
            frame.active = False
        return body.strip() if run else None


def split_words(text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError:
        return []
