"""Waiting on a group's calls without ever hanging, and turning Ray failures into rlctl errors.

A rank that dies (killed, OOM, segfault) or raises makes its result ready with an error at once,
while its peers may sit in a collective waiting for it forever. So the controller never blocks
on all results together: it polls them one by one and stops at the first failure, naming the
role and rank; the group is then killed (its process group cannot recover).
"""

from __future__ import annotations

import os
import pickle
import re
from typing import Any, Sequence

from rlctl.errors import RlctlError, WorkerDiedError
from rlctl.utils.interrupts import in_native_call, safe_point


class UnpicklableWorkerError(Exception):
    """What a worker raises in place of an exception that cannot be pickled (pydantic's ValidationError
    keeps its unpicklable input; an error may hold a lock or a socket): its class name and its message
    in one line. Ray would replace such an exception with "Exception ... isn't serializable" and the
    controller would never see what went wrong. The original stays the cause, in the worker's traceback."""

    def __init__(self, name: str, message: str):
        super().__init__(name, message)
        self.name, self.message = name, message

    def __str__(self) -> str:
        return self.message


def one_line(err: BaseException) -> str:
    """An exception's message in one line: its first line, or for a pydantic validation error (whose
    first line only counts the errors) its title and each error's own message."""
    errors, title = getattr(err, "errors", None), getattr(err, "title", None)
    if callable(errors) and isinstance(title, str):
        try:
            messages = [str(e["msg"]) for e in errors()]
        except Exception:  # noqa: BLE001 - not pydantic's after all: its first line below
            messages = []
        if messages:
            return f"{title}: " + "; ".join(messages)
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[0] if lines else ""


def portable(err: Exception) -> Exception:
    """`err` if Ray can carry it to the controller (it pickles), else an UnpicklableWorkerError."""
    try:
        pickle.dumps(err)
        return err
    except Exception:  # noqa: BLE001 - TypeError, PicklingError, AttributeError: all mean "cannot be carried"
        return UnpicklableWorkerError(type(err).__name__, one_line(err))


def _debug() -> bool:
    return os.environ.get("RLCTL_DEBUG", "") not in ("", "0")


def wait_all(refs: Sequence[Any], *, role: str, method: str, logs: str = "", poll_s: float = 0.5) -> list:
    """Results of `refs` (one per rank, rank order); raises on the first rank that failed."""
    import ray

    index = {ref: rank for rank, ref in enumerate(refs)}
    results: list[Any] = [None] * len(refs)
    pending = list(refs)
    while pending:
        # A timeout keeps Ctrl-C responsive; num_returns=1 reports a failure the moment it happens.
        with in_native_call():   # a stop handler records instead of raising inside Ray's compiled code
            ready, pending = ray.wait(pending, num_returns=1, timeout=poll_s)
        safe_point()   # ...and the stop is raised here (rlctl.utils.interrupts); else nothing
        for ref in ready:
            rank = index[ref]
            try:
                results[rank] = ray.get(ref)
            except Exception as err:  # noqa: BLE001 - every Ray failure is mapped below
                rank, err = _root_cause(rank, err, pending, index)   # ready refs have left pending
                raise worker_error(err, role=role, rank=rank, method=method, logs=logs) from None
    return results


DEATH_GRACE_S = 2.0   # only on a failure: how long a peer's death may lag behind the error it caused


def _root_cause(rank: int, err: BaseException, pending: list, index: dict) -> tuple[int, BaseException]:
    """A rank that raised may only be the first to notice that a peer died (gloo: "Connection closed by
    peer" in a collective) before Ray reports the death itself: wait briefly for such a death among the
    other ranks and name it instead. (rank, error) of the failure to report."""
    import ray
    from ray import exceptions as rx

    if not pending or not isinstance(err, rx.RayTaskError):
        return rank, err
    ready, _ = ray.wait(pending, num_returns=len(pending), timeout=DEATH_GRACE_S)
    for ref in ready:
        try:
            ray.get(ref)
        except (rx.RayActorError, rx.WorkerCrashedError, rx.NodeDiedError, rx.OutOfMemoryError) as death:
            return index[ref], death
        except Exception:  # noqa: BLE001 - another rank's own error: the first one stays the report
            pass
    return rank, err


def worker_error(err: BaseException, *, role: str, rank: int, method: str, logs: str = "") -> RlctlError:
    """The rlctl error for a failed call of `role`.`method` on `rank`."""
    from ray import exceptions as rx

    where = f"{role} worker rank {rank}"
    log_hint = f"the worker's log is under {logs}" if logs else "see Ray's session logs (/tmp/ray/session_latest/logs)"
    if isinstance(err, rx.RayTaskError):
        cause = getattr(err, "cause", None)
        if isinstance(cause, RlctlError):
            # A known error raised inside the worker keeps its class and exit code.
            cause.message = f"{where}: {cause.message}"
            cause.args = (cause.message if cause.hint is None else f"{cause.message} ({cause.hint})",)
            return cause
        name = "an error" if cause is None else cause.name if isinstance(cause, UnpicklableWorkerError) \
            else type(cause).__name__
        first = one_line(cause) if cause is not None else ""
        detail = "\n" + re.sub(r"\x1b\[[0-9;]*m", "", str(err)) if _debug() else ""  # the remote traceback
        return WorkerDiedError(f"{where} raised {name} in {method}: {first}{detail}",
                               hint=None if _debug() else "rerun with RLCTL_DEBUG=1 for the worker's traceback")
    if isinstance(err, rx.OutOfMemoryError):
        return WorkerDiedError(f"{where} was killed for lack of memory during {method}",
                               hint="lower actor.micro_batch_size or data.max_response_length, or use "
                                    "bigger machines")
    if isinstance(err, (rx.RayActorError, rx.WorkerCrashedError, rx.NodeDiedError)):
        reason = _death_reason(err)
        return WorkerDiedError(f"{where} died during {method}{': ' + reason if reason else ''}", hint=log_hint)
    return WorkerDiedError(f"{where} failed during {method}: {type(err).__name__}: {err}", hint=log_hint)


def _death_reason(err: BaseException) -> str:
    """Ray's death cause, one line: "the actor's worker process exited (killed by a signal?)"."""
    text = str(err)
    for marker in ("The actor died unexpectedly", "The actor is dead because", "The worker died",
                   "The process was killed", "Worker exit", "was killed"):
        at = text.find(marker)
        if at >= 0:
            return text[at:].splitlines()[0].strip().rstrip(".")[:200]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:200] if lines else ""
