"""run.max_restarts: a run that loses a worker restarts its workers by itself, in the same command.

A lost worker (killed, OOM, a node gone, a rank that raised: WorkerDiedError, exit 4) ends one
attempt; its ExitStack tears every group down (and the embedded Ray with them). `Restarts.recover`
then prints one line, waits run.restart_backoff_s, and picks the newest checkpoint whose content
verifies (as `rlctl resume` does, falling back past a broken one with a warning); rows logged past
it are dropped, and the next attempt starts fresh groups and loads it. Steps redone after a restart
are the same computation as the first time (seeds are a function of the step), so the run ends
with the uninterrupted run's metrics and weights. Any other error (config, data, reward, NaN) is
never retried: it is not a lost worker and would fail the same way again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlctl.errors import WorkerDiedError


class WorkerLost(Exception):
    """An attempt ended with a lost worker while the restart budget has room."""

    def __init__(self, error: WorkerDiedError):
        super().__init__(error.message)
        self.error = error


@dataclass
class Restarts:
    """The restart budget of one `rlctl train` / `rlctl resume` command and the run's count so far."""

    run_dir: Path
    max_restarts: int
    backoff_s: float
    keep_last: int
    used: int = 0      # restarts in this command (the budget is per command)
    total: int = 0     # restarts over the run's life (run.json "restarts", metric run/restarts)

    @classmethod
    def of_run(cls, config, run_dir: Path, *, command: str) -> "Restarts":
        from rlctl.checkpoint.run_folder import read_run_info

        before = int(read_run_info(run_dir).get("restarts") or 0) if command == "resume" else 0
        return cls(run_dir, config.run.max_restarts, config.run.restart_backoff_s, config.run.keep_last,
                   total=before)

    @property
    def left(self) -> int:
        return self.max_restarts - self.used

    def recover(self, error: WorkerDiedError) -> tuple[tuple[int, Path] | None, list[str]]:
        """One line, the back-off, the checkpoint to continue from: ((step, path) or None to start
        over when none was saved yet, notices for the next attempt's log)."""
        from rlctl.checkpoint.run_folder import write_run_info
        from rlctl.controller.signals import startup_signals

        self.used += 1
        self.total += 1
        print(f"restart {self.used}/{self.max_restarts}: {error.message}; restarting the workers in "
              f"{self.backoff_s:g}s from the newest valid checkpoint", flush=True)
        write_run_info(self.run_dir, restarts=self.total, last_restart_error=error.message)
        with startup_signals() as waiting:   # Ctrl-C / SIGTERM while waiting: stop now, exit 130 / 143
            waiting.sleep(self.backoff_s)
        return self.resume_point()

    def resume_point(self) -> tuple[tuple[int, Path] | None, list[str]]:
        from rlctl.checkpoint.manager import CheckpointManager
        from rlctl.controller.checkpointing import checked_here
        from rlctl.controller.metrics_log import truncate_logs

        manager = CheckpointManager.for_run(self.run_dir, self.keep_last)
        notices = manager.clean_leftovers()
        point = None
        if manager.steps():
            step, path, warning = manager.latest_valid(None, hashes=True, content_of=checked_here)
            point = (step, path)
            notices += [warning] if warning else []
        dropped = truncate_logs(self.run_dir, point[0] if point else 0)
        where = f"checkpoint step {point[0]}" if point else "step 0 (no checkpoint was saved yet)"
        notices.append(f"continuing from {where}" + (f" ({dropped} log rows after it dropped)" if dropped else ""))
        return point, notices
