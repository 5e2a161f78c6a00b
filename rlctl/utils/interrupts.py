"""A stop signal (Ctrl-C, SIGTERM) while rlctl starts Ray and the workers.

Raising from a signal handler is unsafe there: Python runs the handler wherever the main thread
checks for signals, and Ray's compiled code checks inside its own calls (ray.init, ray.wait), so
an exception raised there comes out as `SystemError: ... returned a result with an exception
set`, or is lost. So the handler only records the signal; the main thread raises the stop at its
next safe point (`safe_point()`: between start-up phases and in every polling wait), and a
watchdog thread ends the process after a grace period if the main thread never gets there (it can
be blocked in native code, e.g. Ray's GCS client, for good). Ending it runs the `on_forced`
clean-ups (run.json, Ray's processes), prints one line and exits 130 / 143. A second signal ends
the process at once the same way. Standard library only.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from typing import Callable

from rlctl.errors import EXIT_INTERRUPTED, EXIT_TERMINATED, Interrupted

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_active: list["StartupStop"] = []   # the stop whose handlers are installed, for safe_point()


def stopped(signum: int, how: str) -> Interrupted:
    """The Interrupted for a stop signal: exit 143 for SIGTERM, 130 for Ctrl-C; `how` ends the message."""
    name, code = ("SIGTERM", EXIT_TERMINATED) if signum == signal.SIGTERM else ("Ctrl-C", EXIT_INTERRUPTED)
    return Interrupted(f"stopped by {name}{how}", exit_code=code)


def safe_point() -> None:
    """Raise the pending start-up stop, if any. Call it where raising is safe: plain Python, between
    phases of the start-up and between polls of a wait. Without a start-up in progress: nothing."""
    if _active:
        _active[-1].check()


class StartupStop:
    """Record a stop signal, raise it at the next safe point, end the process if none comes.

    grace_s: how long the main thread has to reach a safe point after the signal; cleanup_s: how
    long it then has to unwind (ray.shutdown, the workers) before the process is ended anyway.
    `on_forced` runs, in order, in the watchdog thread before the forced exit, each called with the
    Interrupted the process ends with; each may fail."""

    MESSAGE = " while starting; no step was run in this session"

    def __init__(self, on_forced: list[Callable[[Interrupted], None]] | None = None, *, grace_s: float = 5.0,
                 cleanup_s: float = 30.0, exit_fn: Callable[[int], None] = os._exit):
        self.on_forced = list(on_forced or [])
        self.grace_s, self.cleanup_s, self._exit = grace_s, cleanup_s, exit_fn
        self.signum = 0
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._deadline: float | None = None   # monotonic time at which the watchdog ends the process
        self._done = False
        self._raised = False
        self._watchdog: threading.Thread | None = None

    # --- the window in which stop signals mean "stop the start-up" -------------------------------
    def __enter__(self) -> "StartupStop":
        self._old = {}
        if threading.current_thread() is threading.main_thread():   # only it may set handlers
            self._old = {signum: signal.signal(signum, self._handle) for signum in STOP_SIGNALS}
        _active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _active.remove(self)
        for signum, handler in self._old.items():
            signal.signal(signum, handler)

    def disarm(self) -> None:
        """The unwinding after the stop is over (or the start-up went through): no forced exit."""
        with self._lock:
            self._done = True
        self._wake.set()

    # --- the signal handler and the safe point ----------------------------------------------------
    def _handle(self, signum, _frame) -> None:
        with self._lock:
            if self.signum:            # a second signal: the user means now
                self._deadline = time.monotonic()
            else:
                self.signum = signum
                self._deadline = time.monotonic() + self.grace_s
        self._start_watchdog()
        self._wake.set()

    def check(self) -> None:
        """At a safe point: raise the stop (once; the caller then unwinds within cleanup_s)."""
        with self._lock:
            if not self.signum or self._raised:
                return
            self._raised = True
            self._deadline = max(self._deadline, time.monotonic() + self.cleanup_s)
        raise stopped(self.signum, self.MESSAGE)

    def sleep(self, seconds: float) -> None:
        """time.sleep that ends at a stop signal (raised here)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.check()
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))
        self.check()

    # --- the watchdog -----------------------------------------------------------------------------
    def _start_watchdog(self) -> None:
        if self._watchdog is None:
            self._watchdog = threading.Thread(target=self._watch, daemon=True, name="rlctl-stop-watchdog")
            self._watchdog.start()

    def _watch(self) -> None:
        while True:
            with self._lock:
                if self._done:
                    return
                left = self._deadline - time.monotonic()
            if left <= 0:
                return self._force()
            self._wake.wait(timeout=left)
            self._wake.clear()

    def _force(self) -> None:
        interrupted = stopped(self.signum, self.MESSAGE + " (start-up did not stop in time: ended it)")
        for cleanup in self.on_forced:
            try:
                cleanup(interrupted)
            except Exception:  # noqa: BLE001 - the exit must happen whatever a clean-up does
                pass
        try:
            print(f"error: {interrupted.message}", file=sys.stderr, flush=True)
        except (OSError, ValueError):   # a closed or broken stderr
            pass
        self._exit(interrupted.exit_code)
