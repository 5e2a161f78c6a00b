"""Rank processes kept for the tests that run one function on every rank of a gloo group.

`torch.multiprocessing.start_processes(fn, args, nprocs, start_method="spawn")` starts new Python
processes for every call, and each pays `import torch` and the transformers import behind a model
(about 7 s of a core). `run_ranks(fn, args, nprocs)` has the same contract — `fn(rank, *args)` in
`nprocs` processes, an error in any of them raised here with its traceback — on processes started
once per pytest process and world size and kept for the next call.

A call gets the caller's environment and `sys.path`. After it, each rank leaves the process group
`fn` joined (if it did not), gets back torch's default dtype, thread count and grad mode, and every
module attribute of rlctl and of the tests that `fn` rebound (a planted fault:
`expert_parallel.dispatch = wrong`) is set back. That covers the modules loaded before the call, so
the ranks import at their start every module of the packages rank code runs (`PRELOADED`: none of
them imports an engine, Ray or transformers) and every rlctl module the pytest process had loaded.
A call that fails, times out or is interrupted ends the ranks: the next call starts new ones.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import sys
import traceback
from multiprocessing.connection import wait
from pathlib import Path

CALL_TIMEOUT_S = 600.0
PRELOADED = ("rlctl.workers", "rlctl.models", "rlctl.algorithms", "rlctl.checkpoint", "rlctl.runtime")
_POOLS: dict[int, list] = {}   # world size -> [(process, connection)] per rank


def run_ranks(fn, args: tuple, nprocs: int, timeout_s: float = CALL_TIMEOUT_S) -> None:
    """fn(rank, *args) on `nprocs` kept processes; raises with the first failing rank's traceback."""
    ranks = _POOLS.get(nprocs) or _start(nprocs)
    _POOLS[nprocs] = ranks
    # the function is unpickled after the rank has the caller's sys.path (a test module imports by it)
    call = (dict(os.environ), list(sys.path), pickle.dumps((fn, args)))
    try:
        for _, conn in ranks:
            conn.send(call)
        errors = _answers(ranks, timeout_s)
    except BaseException:
        _end(_POOLS.pop(nprocs))   # a rank may still be inside fn: never hand it to the next call
        raise
    if errors:
        _end(_POOLS.pop(nprocs))
        rank, trace = errors[0]
        raise RuntimeError(f"rank {rank} of {nprocs} failed:\n{trace}")


def _start(nprocs: int) -> list:
    ctx = mp.get_context("spawn")
    preload = sorted(name for name in sys.modules if name == "rlctl" or name.startswith("rlctl."))
    ranks = []
    for rank in range(nprocs):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(rank, child, preload), daemon=True, name=f"gloo-rank-{rank}")
        proc.start()
        child.close()
        ranks.append((proc, parent))
    return ranks


def _answers(ranks: list, timeout_s: float) -> list[tuple[int, str]]:
    """Each rank's answer: [(rank, traceback)] of the ranks that failed or died."""
    import time

    deadline = time.monotonic() + timeout_s
    pending = {conn: rank for rank, (_, conn) in enumerate(ranks)}
    errors = []
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"ranks {sorted(pending.values())} gave no answer in {timeout_s:.0f} s")
        for conn in wait(list(pending), timeout=left):
            rank = pending.pop(conn)
            try:
                status, trace = conn.recv()
            except EOFError:
                status, trace = "died", f"the process ended (exit code {ranks[rank][0].exitcode})"
            if status != "ok":
                errors.append((rank, trace))
    return sorted(errors)


def _end(ranks: list) -> None:
    for proc, conn in ranks:
        proc.kill()
        proc.join(5.0)
        conn.close()


def _serve(rank: int, conn, preload: list[str]) -> None:
    """Inside a rank: run each call's function, answer ("ok", "") or ("error", traceback)."""
    import importlib
    import pkgutil

    import torch
    import torch.distributed as dist

    for package in PRELOADED:
        preload += [m.name for m in pkgutil.walk_packages(importlib.import_module(package).__path__, package + ".")]
    for name in preload:
        importlib.import_module(name)
    start = (torch.get_default_dtype(), torch.get_num_threads())
    while True:
        try:
            env, path, payload = conn.recv()
        except EOFError:
            return
        os.environ.clear()
        os.environ.update(env)
        sys.path[:] = path
        modules = _our_modules()
        try:
            fn, args = pickle.loads(payload)
            fn(rank, *args)
            answer = ("ok", "")
        except BaseException:   # whatever the test's function raised is this call's failure
            answer = ("error", traceback.format_exc())
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
            torch.set_default_dtype(start[0])
            torch.set_num_threads(start[1])
            torch.set_grad_enabled(True)
            _rebind(modules)
        conn.send(answer)


_MISSING = object()


def _our_modules() -> list[tuple[object, dict]]:
    """(module, a copy of its attributes) of every loaded module of rlctl and of the tests."""
    import rlctl

    roots = (str(Path(rlctl.__file__).parent) + os.sep, str(Path(__file__).resolve().parents[1]) + os.sep)
    return [(module, dict(vars(module))) for module in list(sys.modules.values())
            if (getattr(module, "__file__", None) or "").startswith(roots)]


def _rebind(modules: list[tuple[object, dict]]) -> None:
    """Set back the attributes a call rebound; what it added is left (a lazily loaded submodule)."""
    for module, attrs in modules:
        now = vars(module)
        for name, value in attrs.items():
            if now.get(name, _MISSING) is not value:
                setattr(module, name, value)
