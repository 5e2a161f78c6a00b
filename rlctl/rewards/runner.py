"""Score responses with the reward function in a pool of worker processes, with a per-sample timeout.

A reward function is user code: it can raise, hang, or return junk. Each worker is our own
`multiprocessing` process (spawn context: the controller runs Ray threads, so fork is unsafe)
that imports the function once and then scores chunks of samples, answering one message per
sample. The controller tracks which sample each worker is on; one that runs past `timeout_s` gets
its worker killed and replaced (a thread or concurrent.futures task cannot be stopped), and the
rest of that chunk goes to the new worker.

    with RewardRunner("reward.py:compute_score", config_dir, timeout_s=10, on_error="zero") as rr:
        result = rr.score([{"data_source": ..., "solution_str": ..., "ground_truth": ...}, ...])
        result.scores        # np.float32 [N]
"""

from __future__ import annotations

import logging
import math
import multiprocessing as mp
import os
import signal
import threading
import time
import weakref
from collections import deque
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path

import numpy as np

from rlctl.errors import ConfigError, RewardError
from rlctl.rewards.http import check_reachable
from rlctl.rewards.custom import RewardSpec, check_builtin_sources, load_reward_fn, normalize_score, parse_spec
from rlctl.utils.interrupts import stop_signals_ignored_in_children

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 120.0  # spawning a worker and importing the user's file
CHUNKS_PER_WORKER = 4  # chunks per worker per batch: few messages, yet slow samples balance out
RESERVED_METRICS = ("mean", "std", "max", "min", "errors", "timeouts", "extras_dropped")


@dataclass
class RewardResult:
    """Scores of one batch. Failed samples (with on_error="zero") score 0.0."""

    scores: np.ndarray  # [N] float32
    extras: dict[str, np.ndarray] = field(default_factory=dict)  # [N] float32, NaN where a sample lacks the key
    failed: np.ndarray | None = None  # [N] bool
    errors: dict[int, str] = field(default_factory=dict)  # sample index -> why it failed
    metrics: dict[str, float] = field(default_factory=dict)  # reward/errors, reward/timeouts, reward/<extra> means


class RewardRunner:
    """A process pool that scores samples with a reward function; start once, `close()` at the end."""

    def __init__(self, function_spec: str, config_dir: Path, *, timeout_s: float = 10.0,
                 on_error: str = "fail", workers: int = 2, format_score: float = 0.0, sandbox_url: str = ""):
        if on_error not in ("fail", "zero"):
            raise ConfigError(f"reward.on_error = {on_error!r} is not 'fail' or 'zero'")
        if workers < 1 or not timeout_s > 0:
            raise ConfigError(f"reward.workers ({workers}) must be >= 1 and reward.timeout_s ({timeout_s}) > 0")
        if sandbox_url:   # an unreachable SandboxFusion: exit 2 now, not a failed sample at step 1
            check_reachable(sandbox_url, "sandbox_url")
        self.spec = parse_spec(function_spec, Path(config_dir), format_score, sandbox_url)
        load_reward_fn(self.spec)  # fail now (exit 2), not in a worker mid-run
        self.timeout_s = float(timeout_s)
        self.on_error = on_error
        self._ctx = mp.get_context("spawn")
        self._workers: list[_Worker | None] = [None] * workers
        self._warned: set[str] = set()
        self._sandbox_announced = False
        self._ensure_workers()
        self._finalizer = weakref.finalize(self, _shutdown, self._workers)

    def __enter__(self) -> RewardRunner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        """Stop the worker processes (idempotent)."""
        self._finalizer()

    def check_data_sources(self, data_sources) -> None:
        """Call at startup with the dataset's data sources: ConfigError (exit 2) when the built-ins
        are chosen by data_source and one of them has no built-in scorer."""
        sources = sorted(set(data_sources))
        check_builtin_sources(self.spec, sources)
        self._announce_sandbox(sources)

    def _announce_sandbox(self, sources: list[str]) -> None:
        """When the built-in code reward will run programs locally, probe the sandbox now, in the
        controller: its mode (and the loud warning without namespaces) is said once, at startup."""
        from rlctl.rewards.builtin import CODE_SOURCES

        if self.spec.path is not None or self.spec.sandbox_url or self._sandbox_announced:
            return
        if self.spec.fn_name == "code" or (not self.spec.fn_name and set(sources) & set(CODE_SOURCES)):
            from rlctl.sandbox.isolation import detect, warn_once

            warn_once(detect())
            self._sandbox_announced = True

    def score(self, items: list[dict]) -> RewardResult:
        """Score `items` (dicts with data_source, solution_str, ground_truth, optional extra_info).

        Raises RewardError (exit 5) on the first failed sample with on_error="fail", or when more
        than half of the batch failed with on_error="zero".
        """
        if not self._finalizer.alive:
            raise RuntimeError("RewardRunner.score() after close()")
        n = len(items)
        batch = _Batch(n)
        if n == 0:
            return batch.result()
        self.check_data_sources(it["data_source"] for it in items)
        self._ensure_workers()
        size = max(1, math.ceil(n / (len(self._workers) * CHUNKS_PER_WORKER)))
        queue = deque(_pack(items[i:i + size], i) for i in range(0, n, size))
        try:
            self._run(queue, batch, items)
        finally:
            self._drop_busy_workers()  # after an abort, a busy worker is still on old samples
        self._warn_dropped(batch.dropped)
        return batch.result()

    # -- the scheduling loop ------------------------------------------------------------------

    def _run(self, queue: deque, batch: _Batch, items: list[dict]) -> None:
        while batch.open > 0:
            self._assign(queue)
            live = [w for w in self._workers if w is not None]
            ready = wait([w.conn for w in live], timeout=max(0.0, min(w.wake_at() for w in live) - time.monotonic()))
            for w in live:
                if w.conn in ready:
                    self._drain(w, queue, batch, items)
            now = time.monotonic()
            for slot, w in enumerate(self._workers):
                if w is not None and w.pending and now >= w.deadline:
                    index = w.pending[0][0]
                    self._replace(slot, queue)
                    self._fail(batch, items, index, f"timed out after {self.timeout_s:g} s", timeout=True)
                elif w is not None and not w.ready and now >= w.started_at + STARTUP_TIMEOUT_S:
                    raise RewardError(f"a reward worker did not start within {STARTUP_TIMEOUT_S:g} s",
                                      hint="check that importing the reward file is fast and does not block.")

    def _assign(self, queue: deque) -> None:
        for w in self._workers:
            if queue and w is not None and w.ready and not w.pending:
                chunk = queue.popleft()
                try:
                    w.conn.send(chunk)
                except OSError:  # died while idle: the drain below sees EOF and replaces it
                    queue.appendleft(chunk)
                    continue
                w.pending = deque(chunk)
                w.deadline = time.monotonic() + self.timeout_s

    def _drain(self, w: _Worker, queue: deque, batch: _Batch, items: list[dict]) -> None:
        """Read every message waiting from worker `w`; replace it if it died."""
        try:
            while w.conn.poll():
                kind, payload = w.conn.recv()
                if kind == "ready":
                    w.ready = True
                elif kind == "load_error":
                    raise ConfigError(f"reward worker could not load {self.spec.label}: {payload}")
                else:  # "result": one sample done; the next one starts now
                    index = w.pending.popleft()[0]
                    w.deadline = time.monotonic() + self.timeout_s
                    self._record(batch, items, index, payload)
        except (EOFError, OSError):
            w.process.join(1.0)
            code = w.process.exitcode
            if not w.ready:
                raise RewardError(f"a reward worker exited during startup (exit code {code})",
                                  hint="run the reward file with `python` to see why it crashes.") from None
            index = w.pending[0][0] if w.pending else None
            self._replace(self._workers.index(w), queue)
            if index is not None:
                self._fail(batch, items, index, f"the reward worker process died (exit code {code})")

    def _record(self, batch: _Batch, items: list[dict], index: int, payload) -> None:
        error, score, extras, dropped = payload
        if error is not None:
            self._fail(batch, items, index, error)
            return
        batch.scores[index] = score
        batch.open -= 1
        for key, value in extras.items():
            batch.extras.setdefault(key, np.full(batch.n, np.nan, dtype=np.float32))[index] = value
        batch.dropped.update(dropped)

    def _fail(self, batch: _Batch, items: list[dict], index: int, why: str, *, timeout: bool = False) -> None:
        if self.on_error == "fail":
            raise RewardError(f"reward failed on {_describe(items, index, why)}",
                              hint='fix the reward function, or set reward.on_error = "zero" to score such samples 0.')
        batch.errors[index] = why
        batch.timeouts += timeout
        batch.open -= 1
        if len(batch.errors) * 2 > batch.n:  # stop now: waiting out more timeouts changes nothing
            first = min(batch.errors)
            raise RewardError(f"the reward function failed on more than half of a batch of {batch.n} samples; "
                              f"first: {_describe(items, first, batch.errors[first])}",
                              hint='fix the reward function; reward.on_error = "zero" tolerates up to half.')

    # -- worker lifecycle ---------------------------------------------------------------------

    def _ensure_workers(self) -> None:
        for slot, w in enumerate(self._workers):
            if w is None or not w.process.is_alive():
                if w is not None:
                    w.stop()
                self._workers[slot] = _Worker(self._ctx, self.spec)

    def _replace(self, slot: int, queue: deque) -> None:
        """Kill the worker in `slot`; samples after the one it was on go back to the queue."""
        w = self._workers[slot]
        rest = list(w.pending)[1:]
        if rest:
            queue.appendleft(rest)
        w.stop()
        self._workers[slot] = _Worker(self._ctx, self.spec)

    def _drop_busy_workers(self) -> None:
        for slot, w in enumerate(self._workers):
            if w is not None and w.pending:
                w.stop()
                self._workers[slot] = None  # respawned by the next score()

    def _warn_dropped(self, dropped: set[str]) -> None:
        for key in sorted(dropped - self._warned):
            log.warning("reward function %s returned a non-numeric %r; it is not logged as a metric",
                        self.spec.label, key)
        self._warned |= dropped


class _Batch:
    """Book-keeping of one score() call."""

    def __init__(self, n: int):
        self.n, self.open, self.timeouts = n, n, 0
        self.scores = np.zeros(n, dtype=np.float32)
        self.extras: dict[str, np.ndarray] = {}
        self.errors: dict[int, str] = {}
        self.dropped: set[str] = set()

    def result(self) -> RewardResult:
        failed = np.zeros(self.n, dtype=bool)
        failed[list(self.errors)] = True
        metrics = {"reward/errors": float(len(self.errors)), "reward/timeouts": float(self.timeouts),
                   "reward/extras_dropped": float(len(self.dropped))}
        for key, values in self.extras.items():
            name = f"reward/extra/{key}" if key in RESERVED_METRICS or "/" in key else f"reward/{key}"
            if not np.isnan(values).all():
                metrics[name] = float(np.nanmean(values))
        return RewardResult(self.scores, self.extras, failed, dict(sorted(self.errors.items())), metrics)


class _Worker:
    """One reward process and the samples it has been sent but not answered yet (in order)."""

    def __init__(self, ctx, spec: RewardSpec):
        self.conn, child = ctx.Pipe(duplex=True)
        self.process = ctx.Process(target=_worker_main, args=(child, spec), daemon=True, name="rlctl-reward")
        with stop_signals_ignored_in_children():   # a Ctrl-C while it imports: no traceback of its own
            self.process.start()
        child.close()
        self.ready = False
        self.started_at = time.monotonic()
        self.pending: deque = deque()
        self.deadline = math.inf

    def wake_at(self) -> float:
        if not self.ready:
            return self.started_at + STARTUP_TIMEOUT_S
        return self.deadline if self.pending else math.inf

    def stop(self) -> None:
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5.0)
        self.conn.close()


def _shutdown(workers: list) -> None:
    """Ask idle workers to exit, kill the rest; runs on close(), garbage collection or exit."""
    for w in workers:
        if w is not None and not w.pending and w.process.is_alive():
            try:
                w.conn.send(None)
            except OSError:
                pass
    for w in workers:
        if w is not None:
            w.process.join(1.0)
            w.stop()


def _pack(items: list[dict], start: int) -> list[tuple]:
    return [(start + i, it["data_source"], it["solution_str"], it["ground_truth"], it.get("extra_info"))
            for i, it in enumerate(items)]


def _describe(items: list[dict], index: int, why: str) -> str:
    return f"sample {index} (data_source {items[index].get('data_source')!r}): {why}"


# -- inside a worker process ------------------------------------------------------------------

def _worker_main(conn, spec: RewardSpec) -> None:
    """Load the function once, then answer each sample of each chunk with one message."""
    # Ctrl-C and SIGTERM reach the whole process group; stopping is the controller's call (it
    # finishes the step, saves, then closes this pool), and a worker exits with its parent.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _exit_with_parent(os.getppid())
    if spec.path is None:  # built-ins: a sandbox warning, if any, was given once by the controller
        from rlctl.sandbox.isolation import mark_warned

        mark_warned()
    try:
        _serve(conn, spec)
    except (BrokenPipeError, ConnectionResetError):   # the controller ended first (a stop): no one to answer
        return


def _serve(conn, spec: RewardSpec) -> None:
    try:
        call = load_reward_fn(spec)
    except Exception as e:
        conn.send(("load_error", getattr(e, "message", str(e))))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            chunk = conn.recv()
        except (EOFError, OSError):
            return
        if chunk is None:
            return
        for _index, data_source, solution_str, ground_truth, extra_info in chunk:
            conn.send(("result", _score_one(call, data_source, solution_str, ground_truth, extra_info)))


def _score_one(call, data_source, solution_str, ground_truth, extra_info):
    """(error or None, score, numeric extras, dropped extra names) for one sample."""
    try:
        value = call(data_source, solution_str, ground_truth, extra_info)
    except (Exception, SystemExit) as e:  # user code: whatever it raises is that sample's error
        return (f"{type(e).__name__}: {e}"[:300], 0.0, {}, [])
    try:
        score, extras, dropped = normalize_score(value)
    except ValueError as e:
        return (str(e)[:300], 0.0, {}, [])
    return (None, score, extras, dropped)


def _exit_with_parent(parent_pid: int) -> None:
    """A worker hung in user code must not outlive a controller that was killed with SIGKILL."""
    def watch():
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="rlctl-reward-watchdog").start()
