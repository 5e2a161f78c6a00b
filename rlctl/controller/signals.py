"""Ctrl-C and SIGTERM during `rlctl train` / `rlctl resume`.

While Ray and the workers start, a signal stops right away (`startup_signals`: nothing to save
yet). Once training runs, it only raises a flag (`StopFlag`) that the loop checks at its safe
point after each step, where the final checkpoint is written; a second signal of either kind
(`StopNow`) abandons the step, or the final save, at once: a save in progress is removed, and the
newest complete checkpoint stays the one resume picks. Either way the run ends with exit 143
(SIGTERM) or 130 (Ctrl-C).
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

from rlctl.errors import EXIT_INTERRUPTED, EXIT_TERMINATED, Interrupted

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def stopped(signum: int, how: str) -> Interrupted:
    """The Interrupted for a stop signal: exit 143 for SIGTERM, 130 for Ctrl-C; `how` ends the message."""
    name, code = ("SIGTERM", EXIT_TERMINATED) if signum == signal.SIGTERM else ("Ctrl-C", EXIT_INTERRUPTED)
    return Interrupted(f"stopped by {name}{how}", exit_code=code)


class StopNow(Interrupted):
    """A second Ctrl-C / SIGTERM: stop where the run is, without the final checkpoint."""


class StopFlag:
    """Ctrl-C / SIGTERM ask the loop to stop at the next safe point; a second one stops now."""

    def __init__(self):
        self.signum = 0

    def __enter__(self):
        self._old = {signum: signal.signal(signum, self._handle) for signum in STOP_SIGNALS}
        return self

    def __exit__(self, *exc):
        for signum, handler in self._old.items():
            signal.signal(signum, handler)

    def _handle(self, signum, _frame):
        if self.signum:
            first = stopped(signum, " twice: the step in progress was abandoned without a checkpoint; "
                                    "rlctl resume continues from the newest one")
            raise StopNow(first.message, exit_code=first.exit_code)
        self.signum = signum

    def check(self):
        if self.signum:
            raise stopped(self.signum, " at a safe point")


class _StopStarting(BaseException):
    """What the start-up handler raises: a BaseException, like KeyboardInterrupt, because it can land
    anywhere inside Ray's start-up, where `except Exception` code would take it for an ordinary
    error and carry on starting (a signalled `rlctl train` was found hung inside ray.init in the
    suite). startup_signals turns it into the Interrupted on the way out."""

    def __init__(self, interrupted: Interrupted):
        super().__init__(interrupted.message)
        self.interrupted = interrupted


@contextmanager
def startup_signals():
    """Ctrl-C / SIGTERM while Ray and the workers start: stop right away (nothing to save yet)
    with exit 130 / 143, unwinding through every cleanup, instead of Ray's own SIGTERM handler
    (a native stack dump, exit 1). ray_session restores these handlers after ray.init."""
    def handle(signum, _frame):
        raise _StopStarting(stopped(signum, " while starting; no step was run in this session"))

    if threading.current_thread() is not threading.main_thread():   # only it may set handlers
        yield
        return
    old = {signum: signal.signal(signum, handle) for signum in STOP_SIGNALS}
    try:
        yield
    except _StopStarting as e:
        raise e.interrupted from None
    finally:
        for signum, handler in old.items():
            signal.signal(signum, handler)
