"""Ctrl-C and SIGTERM during `rlctl train` / `rlctl resume`.

While Ray and the workers start, a signal stops the start-up at its next safe point, or a
watchdog ends the process when it gets stuck (`startup_stop`, rlctl.utils.interrupts: nothing to
save yet). Once training runs, it only raises a flag (`StopFlag`) that the loop checks at its safe
point after each step, where the final checkpoint is written; a second signal of either kind
(`StopNow`) abandons the step, or the final save, at once: a save in progress is removed, and the
newest complete checkpoint stays the one resume picks. Either way the run ends with exit 143
(SIGTERM) or 130 (Ctrl-C).
"""

from __future__ import annotations

import signal
from contextlib import contextmanager
from pathlib import Path

from rlctl.errors import Interrupted
from rlctl.utils.interrupts import STOP_SIGNALS, StartupStop, in_native, safe_points, stopped

__all__ = ["STOP_SIGNALS", "StopFlag", "StopNow", "startup_signals", "startup_stop", "stopped"]


class StopNow(Interrupted):
    """A second Ctrl-C / SIGTERM: stop where the run is, without the final checkpoint."""


class StopFlag:
    """Ctrl-C / SIGTERM ask the loop to stop at the next safe point; a second one stops now."""

    def __init__(self):
        self.signum = 0
        self._now: StopNow | None = None

    def __enter__(self):
        self._old = {signum: signal.signal(signum, self._handle) for signum in STOP_SIGNALS}
        self._points = safe_points(self)
        self._points.__enter__()
        return self

    def __exit__(self, *exc):
        self._points.__exit__(*exc)
        for signum, handler in self._old.items():
            signal.signal(signum, handler)

    def _handle(self, signum, _frame):
        if self.signum:
            first = stopped(signum, " twice: the step in progress was abandoned without a checkpoint; "
                                    "rlctl resume continues from the newest one")
            now = StopNow(first.message, exit_code=first.exit_code)
            if in_native():   # inside ray.wait: raising there is a SystemError; the poll's safe point raises it
                self._now = now
                return
            raise now
        self.signum = signum

    def at_safe_point(self):
        """A second signal that came inside a Ray call: raised here, once."""
        now, self._now = self._now, None
        if now is not None:
            raise now

    def check(self):
        if self.signum:
            raise stopped(self.signum, " at a safe point")


@contextmanager
def startup_signals():
    """Ctrl-C / SIGTERM while waiting to restart the workers: `.sleep(seconds)` raises the stop
    (exit 130 / 143) as soon as one comes."""
    stop = StartupStop()
    try:
        with stop:
            yield stop
    finally:
        stop.disarm()


def startup_stop(run_dir: Path) -> StartupStop:
    """The stop for a run's start-up (Ray, the workers, a checkpoint being loaded): raised at the
    next safe point, or, when the main thread does not get there in time, the process is ended
    after run.json says "interrupted" and this machine's Ray processes of the run are gone."""
    from rlctl.checkpoint.run_folder import finish_run
    from rlctl.runtime.ray_env import end_ray_processes

    def record(interrupted: Interrupted) -> None:
        finish_run(run_dir, status="interrupted", exit_code=interrupted.exit_code, error=interrupted.message)

    return StartupStop([record, lambda _: end_ray_processes()])
