"""Handing the C heap's free pages back to the operating system (glibc's malloc_trim).

A training step's activations are mostly tensors of a few MB, below glibc's mmap threshold, so
they are carved out of the heap, and when they are freed glibc keeps their pages for the next
allocation. The next step reuses most of them, so a rank's resident memory settles a little above
its update's working set; but that retained memory is resident between the phases too, and a
one-off allocation (a checkpoint's state) lands on top of it. Measured on SmolLM2-135M at 160
tokens (docs/benchmarks.md, "The heap between steps"): a rank held 1.85 GB of live tensors and
6.7 GB of resident memory after its tenth update, and the final checkpoint save took it to 8.8 GB;
trimmed first, the save started from 3.4 GB.

Trimming after every phase would also keep the resting memory low, but each phase then faults its
pages back in: 1-2 s more a step there (10%), for a lower peak of the update of 0.3-0.7 GB. So
rlctl trims only before one-off allocations (the checkpoint save), where nothing is reused.
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
