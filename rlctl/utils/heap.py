"""Handing the C heap's free pages back to the operating system (glibc's malloc_trim).

A training step's activations are mostly tensors of a few MB, below glibc's mmap threshold, so
they are carved out of the heap, and when they are freed glibc keeps their pages for the next
allocation. The next step reuses most of them, so a rank's resident memory settles a little above
its update's working set; but that retained memory stays resident between the phases too, and a
one-off allocation (a checkpoint's gathered state) lands on top of it. Measured on SmolLM2-135M
at 160 tokens, bf16 (docs/benchmarks.md, "The heap between steps"): after ten updates a rank held
1,850 MiB of live tensors in 6,735 MiB of resident memory, and the final checkpoint save took it to
8,793 MiB, the run's peak; trimmed first, the save starts from 3,439 MiB and stays below the update's peak.

Trimming after every phase would keep the resting memory low as well, but each phase then faults
its pages back in: 2.5-3.1 s more a step there (8-10%), for an update peak ~0.4 GB lower. So rlctl
trims before one-off allocations (the checkpoint save), where nothing freed would have been reused.
"""

from __future__ import annotations

import functools


def release_free_heap() -> None:
    """malloc_trim(0): every whole free page of the heap's arenas goes back to the OS (a no-op
    where the C library is not glibc). Costs ~0.2 s with ~3 GB free, far less with little."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim from the symbols the process already has, or None (musl, macOS)."""
    import ctypes

    try:
        return ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
