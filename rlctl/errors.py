"""Known errors and their exit codes (docs/architecture.md, "Exit codes and errors").

Every error a user can cause is one of these. The CLI prints `error: <message>` on one line and
exits with `exit_code`; a traceback is shown only with RLCTL_DEBUG=1. Messages say what went
wrong, why, and how to fix it.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1
EXIT_USAGE = 2
EXIT_DATA = 3
EXIT_WORKER = 4
EXIT_NUMERICAL = 5
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


class RlctlError(Exception):
    """Base of all known errors; `exit_code` is what the process exits with."""

    exit_code = EXIT_INTERNAL

    def __init__(self, message: str, *, hint: str | None = None):
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{message} ({hint})")


class UsageError(RlctlError):
    """Bad command-line usage or a bad config (exit 2)."""

    exit_code = EXIT_USAGE


class ConfigError(UsageError):
    """One or more problems in rlctl.toml or its overrides; `problems` lists them all."""

    def __init__(self, message: str, problems: list | None = None, *, hint: str | None = None):
        super().__init__(message, hint=hint)
        self.problems = problems or []


class DataError(RlctlError):
    """A data file, a model folder or a download is missing or broken (exit 3)."""

    exit_code = EXIT_DATA


class CheckpointError(DataError):
    """A checkpoint is missing, broken or does not fit the run (exit 3)."""


class CorruptCheckpointError(CheckpointError):
    """A checkpoint file's content differs from its manifest, found by a rank about to load it
    (exit 3): resume and recovery fall back to the previous valid step."""


class WorkerDiedError(RlctlError):
    """A Ray worker died or raised (exit 4); the message names the role and rank."""

    exit_code = EXIT_WORKER


class NumericalError(RlctlError):
    """Non-finite loss/gradients several steps in a row (exit 5)."""

    exit_code = EXIT_NUMERICAL


class RewardError(RlctlError):
    """The reward function failed beyond what `reward.on_error` tolerates (exit 5)."""

    exit_code = EXIT_NUMERICAL


class Interrupted(RlctlError):
    """Ctrl-C (exit 130) or SIGTERM (exit 143), raised at a safe point."""

    def __init__(self, message: str, exit_code: int = EXIT_INTERRUPTED):
        super().__init__(message)
        self.exit_code = exit_code
