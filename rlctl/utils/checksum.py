"""Checksums of checkpoint files: what MANIFEST.json records per file and how a file is checked
against it, shared by the controller (rlctl.checkpoint.manifest) and the ranks that load shards
(rlctl.workers.compute.checkpoint_io).

zlib.crc32 is the fastest stdlib checksum here (bench/checksum_bench.py: 3.4 GB/s a thread against
sha256's 1.6 and blake2b's 0.9): it guards against corruption, not tampering. Manifests written
before it carry "sha256" per file, which is still read. Files stream in 1 MiB blocks, a few at a
time in threads (zlib and hashlib release the GIL on large buffers).
"""

from __future__ import annotations

import hashlib
import os
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MANIFEST = "MANIFEST.json"           # a checkpoint step folder's manifest, written last inside it
BLOCK = 1 << 20
CHECKSUM = "crc32"                   # what a new manifest records per file
CHECKSUMS = ("crc32", "sha256")      # what verification reads, first found wins (sha256: older manifests)


def hash_file(path: Path, *, fsync: bool = False) -> tuple[int, str]:
    """(size, sha256 hex) of `path`, read in 1 MiB blocks; fsync=True also flushes it to disk."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        buf = bytearray(BLOCK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            digest.update(view[:n])
            size += n
        if fsync:
            os.fsync(f.fileno())
    return size, digest.hexdigest()


def checksum_file(path: Path, algorithm: str = CHECKSUM, *, fsync: bool = False) -> tuple[int, str]:
    """(size, hex checksum) of `path` with `algorithm` ("crc32" or "sha256"), read in 1 MiB blocks."""
    if algorithm == "sha256":
        return hash_file(path, fsync=fsync)
    if algorithm != "crc32":
        raise ValueError(f"unknown checksum {algorithm!r}; this rlctl reads {', '.join(CHECKSUMS)}")
    crc = size = 0
    with open(path, "rb") as f:
        buf = bytearray(BLOCK)
        view = memoryview(buf)
        while n := f.readinto(buf):
            crc = zlib.crc32(view[:n], crc)
            size += n
        if fsync:
            os.fsync(f.fileno())
    return size, f"{crc:08x}"


def hash_many(jobs: list[tuple[Path, str]], *, fsync: bool) -> list[tuple[int, str]]:
    """checksum_file over (path, algorithm) pairs, a few files at a time."""
    workers = max(1, min(8, os.cpu_count() or 1, len(jobs)))
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda job: checksum_file(job[0], job[1], fsync=fsync), jobs))


def content_problems(step_dir: Path, entries: list[dict]) -> list[str]:
    """Files whose checksum differs from their manifest entry's (crc32, or sha256 in older manifests)."""
    problems, jobs = [], []
    for entry in entries:
        algorithm = next((a for a in CHECKSUMS if isinstance(entry.get(a), str)), None)
        if algorithm is None:
            problems.append(f"{entry['path']} has no checksum in the manifest ({' or '.join(CHECKSUMS)})")
        else:
            jobs.append((entry, algorithm))
    hashed = hash_many([(step_dir / e["path"], a) for e, a in jobs], fsync=False)
    for (entry, algorithm), (_, checksum) in zip(jobs, hashed):
        if checksum != entry[algorithm]:
            problems.append(f"{entry['path']} does not match its {algorithm} in the manifest (corrupted)")
    return problems
