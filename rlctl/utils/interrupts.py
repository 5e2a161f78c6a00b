"""A stop signal (Ctrl-C, SIGTERM) while rlctl starts Ray and the workers.

Raising from a signal handler is unsafe there: Python runs the handler wherever the main thread
checks for signals, and Ray's compiled code checks inside its own calls (ray.init, ray.wait), so
an exception raised there comes out as `SystemError: ... returned a result with an exception
set`, or is lost. So the handler only records the signal; the main thread raises the stop at its
next safe point (`safe_point()`: between start-up phases and in every polling wait), and a
watchdog thread ends the process after a grace period if the main thread never gets there (it can
be blocked in native code, e.g. Ray's GCS client, for good; then no Python handler runs at all,
so the watchdog hears the signal through `signal.set_wakeup_fd`). Ending it runs the `on_forced`
clean-ups (run.json, Ray's processes), prints one line and exits 130 / 143. A second signal ends
the process at once the same way. Standard library only.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator

from rlctl.errors import EXIT_INTERRUPTED, EXIT_TERMINATED, Interrupted

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

_active: list = []   # what safe_point() asks (its at_safe_point()): the innermost stop handler in force
_native_depth = [0]   # > 0 while the main thread is inside a Ray call (in_native_call)


def stopped(signum: int, how: str) -> Interrupted:
    """The Interrupted for a stop signal: exit 143 for SIGTERM, 130 for Ctrl-C; `how` ends the message."""
    name, code = ("SIGTERM", EXIT_TERMINATED) if signum == signal.SIGTERM else ("Ctrl-C", EXIT_INTERRUPTED)
    return Interrupted(f"stopped by {name}{how}", exit_code=code)


def safe_point() -> None:
    """Raise the pending stop, if any: a start-up's, or a second signal's during training. Call it
    where raising is safe: plain Python, between phases of the start-up and between polls of a
    wait. Without a stop pending: nothing."""
    if _active:
        _active[-1].at_safe_point()


@contextmanager
def safe_points(handler) -> Iterator[None]:
    """While inside: safe_point() asks `handler.at_safe_point()` (which raises what is pending)."""
    _active.append(handler)
    try:
        yield
    finally:
        _active.remove(handler)


@contextmanager
def in_native_call() -> Iterator[None]:
    """Around a call into Ray's compiled code (ray.wait): a signal handler must not raise in there
    (it comes out as a SystemError); handlers ask `in_native()` and leave the stop to safe_point()."""
    _native_depth[0] += 1
    try:
        yield
    finally:
        _native_depth[0] -= 1


@contextmanager
def stop_signals_ignored_in_children() -> Iterator[None]:
    """Around starting a child process (multiprocessing's spawn): the child is born ignoring SIGINT
    and SIGTERM, so a Ctrl-C to the process group cannot raise KeyboardInterrupt (and print its
    traceback) while it still imports (spawn re-imports the parent's main module: typer, for
    `rlctl train`). An ignored disposition is what exec keeps (spawn starts a child unblocked),
    so this process ignores them for the few milliseconds of the fork and exec; a stop signal in
    that window is lost (press Ctrl-C again). Only the main thread can change dispositions:
    elsewhere, or where a handler was not set from Python (it could not be put back), the child
    starts unprotected."""
    if threading.current_thread() is not threading.main_thread() \
            or any(signal.getsignal(signum) is None for signum in STOP_SIGNALS):
        yield
        return
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def in_native() -> bool:
    return _native_depth[0] > 0


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
        self._lock = threading.RLock()   # RLock: the handler may run in the main thread while it holds it
        self._deadline: float | None = None   # monotonic time at which the watchdog ends the process
        self._done = self._raised = self._in_window = False
        self._deliveries = {"handler": 0, "wakeup": 0}
        self._seen = 0
        self._socks: list[socket.socket] = []
        self._watchdog: threading.Thread | None = None
        self._old: dict = {}
        self._old_wakeup: int | None = None

    # --- the window in which stop signals mean "stop the start-up" -------------------------------
    def __enter__(self) -> "StartupStop":
        if threading.current_thread() is threading.main_thread():   # only it may set handlers
            # Python runs a handler only when the main thread gets back to Python code, never while it
            # is blocked in native code; the wakeup fd is written by the C-level handler at once, so
            # the watchdog thread hears the signal however the main thread is stuck.
            self._wakeup_r, wakeup_w = socket.socketpair()
            self._poke_r, self._poke_w = socket.socketpair()
            self._socks = [self._wakeup_r, wakeup_w, self._poke_r, self._poke_w]
            for sock in self._socks:
                sock.setblocking(False)
            self._old = {signum: signal.signal(signum, self._handle) for signum in STOP_SIGNALS}
            self._old_wakeup = signal.set_wakeup_fd(wakeup_w.fileno(), warn_on_full_buffer=False)
            self._in_window = True
            self._watchdog = threading.Thread(target=self._watch, daemon=True, name="rlctl-stop-watchdog")
            self._watchdog.start()
        _active.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _active.remove(self)
        if self._old_wakeup is not None:
            signal.set_wakeup_fd(self._old_wakeup)
        for signum, handler in self._old.items():
            signal.signal(signum, handler)
        with self._lock:
            self._in_window = False
            if self._watchdog is not None and not self._watchdog.is_alive():
                self._close()
        if not self.signum:   # nothing to watch over any more
            self.disarm()
        elif exc[0] is not None and issubclass(exc[0], Exception):
            # An error after a stop signal is the stop's doing (SIGTERM to the process group also ends
            # Ray's GCS, and ray.init then fails to reach it): the user's stop, not a crash.
            self.check()

    def disarm(self) -> None:
        """The unwinding after the stop is over (or the start-up went through): no forced exit."""
        with self._lock:
            self._done = True
        self._poke()

    # --- the signal, from the handler or the wakeup fd, and the safe point ------------------------
    def _handle(self, signum, _frame) -> None:
        self._record(signum, "handler")

    def _record(self, signum: int, via: str) -> None:
        """One delivery of `signum`, heard by the Python handler or the wakeup fd (each hears every
        delivery, the handler possibly fewer: Python merges repeats): count each delivery once."""
        with self._lock:
            self._deliveries[via] += 1
            if self._deliveries[via] <= self._seen:
                return
            self._seen += 1
            if self.signum:            # a second signal: the user means now
                self._deadline = time.monotonic()
            else:
                self.signum = signum
                self._deadline = time.monotonic() + self.grace_s
        self._poke()

    def _poke(self) -> None:
        try:
            self._poke_w.send(b"x")
        except (AttributeError, OSError):   # no watchdog (not the main thread), closed, or already poked
            pass

    def check(self) -> None:
        """At a safe point: raise the stop (once; the caller then unwinds within cleanup_s)."""
        with self._lock:
            if not self.signum or self._raised:
                return
            self._raised = True
            self._deadline = max(self._deadline, time.monotonic() + self.cleanup_s)
        self._poke()
        raise stopped(self.signum, self.MESSAGE)

    at_safe_point = check

    def sleep(self, seconds: float) -> None:
        """time.sleep that ends at a stop signal (raised here)."""
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            self.check()
            time.sleep(min(0.1, max(0.0, end - time.monotonic())))
        self.check()

    # --- the watchdog -----------------------------------------------------------------------------
    def _watch(self) -> None:
        try:
            while True:
                with self._lock:
                    if self._done:
                        return
                    left = None if self._deadline is None else self._deadline - time.monotonic()
                if left is not None and left <= 0:
                    return self._force()
                readable, _, _ = select.select([self._wakeup_r, self._poke_r], [], [], left)
                for sock in readable:
                    data = sock.recv(256)
                    for signum in data if sock is self._wakeup_r else b"":
                        if signum in STOP_SIGNALS:
                            self._record(signum, "wakeup")
        finally:
            with self._lock:
                if not self._in_window:   # else the wakeup fd still names a socket: __exit__ closes them
                    self._close()

    def _close(self) -> None:
        for sock in self._socks:
            sock.close()

    def _force(self) -> None:
        interrupted = stopped(self.signum, self.MESSAGE + " (start-up did not stop in time: ended it)")
        for cleanup in self.on_forced:
            try:
                cleanup(interrupted)
            except Exception:  # noqa: BLE001 - the exit must happen whatever a clean-up does
                pass
        try:
            print(interrupted.message, file=sys.stderr, flush=True)   # a stop the user asked for is no error
        except (OSError, ValueError):   # a closed or broken stderr
            pass
        self._exit(interrupted.exit_code)
