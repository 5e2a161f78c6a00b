"""Known errors and their exit codes (docs/architecture.md, "Exit codes and errors").

Every error a user can cause is one of these. The CLI prints `error: <message>` on one line and
exits with `exit_code`; a traceback is shown only with RLCTL_DEBUG=1. Messages say what went
wrong, why, and how to fix it.
"""

from __future__ import annotations

import errno
import os

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


# An OSError with these errnos on a path means the path the user named cannot be written (or
# read): no permission, a read-only disk or mount, or a file where a folder was meant.
UNUSABLE_PATH_ERRNOS = {errno.EACCES: "", errno.EPERM: "", errno.EROFS: "",
                        errno.ENOTDIR: " (a part of the path is a file, not a folder)",
                        errno.EISDIR: " (it is a folder, not a file)",
                        errno.EEXIST: " (a file is where a folder is needed)"}   # mkdir(exist_ok) on a file


def unusable_path(exc: BaseException) -> UsageError | None:
    """The exit-2 error for an OSError (or an error raised from one) about a path that cannot be
    used: what, why, how to fix; None for any other error."""
    for _ in range(8):   # the exception, then what it was raised from
        if exc is None:
            return None
        if isinstance(exc, OSError) and exc.errno in UNUSABLE_PATH_ERRNOS and exc.filename is not None:
            why = os.strerror(exc.errno).lower() + UNUSABLE_PATH_ERRNOS[exc.errno]
            where = os.fsdecode(exc.filename)
            head, name = os.path.split(where)
            if name.startswith(".") and "tmp" in name:   # an atomic writer's temporary file: name its folder
                where = f"into {head or '.'}"
            return UsageError(f"cannot write {where}: {why}",
                              hint="choose a path this user can write (a folder you own, on a writable disk)")
        exc = exc.__cause__ or exc.__context__
    return None
