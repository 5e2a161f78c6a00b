"""release_free_heap hands freed heap pages back: the resident memory of this process falls."""

from __future__ import annotations

import ctypes
import os

import pytest

from rlctl.utils.heap import _malloc_trim, release_free_heap

CHUNK, COUNT = 64 << 10, 2048   # 128 MiB freed in 64 KiB blocks: below glibc's mmap threshold, so in the heap


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")   # 64 KiB on some arm64 kernels


@pytest.mark.skipif(_malloc_trim() is None, reason="the C library is not glibc: release_free_heap is a no-op here")
def test_freed_heap_pages_go_back_to_the_os():
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    blocks = [libc.malloc(CHUNK) for _ in range(2 * COUNT)]   # carved one after the other from the heap
    for block in blocks:
        ctypes.memset(block, 1, CHUNK)      # resident
    for block in blocks[::2]:               # every other one: each freed block sits between two live ones,
        libc.free(block)                    # so free() cannot merge it into the heap's top and give it back
    retained = _rss_bytes()
    release_free_heap()
    released = retained - _rss_bytes()
    for block in blocks[1::2]:
        libc.free(block)
    assert released > COUNT * CHUNK // 2, f"only {released >> 20} MiB of {COUNT * CHUNK >> 20} MiB free went back"
