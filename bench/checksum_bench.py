"""Checksum throughput for checkpoint verification: sha256, blake2b and zlib.crc32 over a file.

    python bench/checksum_bench.py [--mb 512] [--repeat 3]

Writes a file of random bytes, reads it once to warm the page cache, then hashes it with each
algorithm the way rlctl.checkpoint.manifest reads shards (1 MiB blocks, readinto one buffer) and
prints GB/s per algorithm (the best of --repeat; one thread, so it is the cost per rank). Then
what verification pays over a checkpoint folder of 4 such files (the manifest's crc32, a few files
at a time in threads): all of it in one process (verify(hashes=True), what merge does), and what
each rank pays at load, where the ranks split a role's files (rlctl.workers.compute.checkpoint_io.
verify_share: file i by rank i % world): 100 GB over --ranks ranks, at the rate one rank measured here.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import tempfile
import time
import zlib

BLOCK = 1 << 20


def _digest(name: str, path: str) -> str:
    buf = bytearray(BLOCK)
    view = memoryview(buf)
    if name == "crc32":
        crc = 0
        with open(path, "rb") as f:
            while n := f.readinto(buf):
                crc = zlib.crc32(view[:n], crc)
        return f"{crc:08x}"
    digest = hashlib.new(name)
    with open(path, "rb") as f:
        while n := f.readinto(buf):
            digest.update(view[:n])
    return digest.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=512, help="file size in MiB")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--ranks", default="8,16,64", help="rank counts to give the per-rank cost of 100 GB for")
    args = parser.parse_args()
    with tempfile.NamedTemporaryFile(delete=False) as f:
        for _ in range(args.mb):
            f.write(os.urandom(BLOCK))
        path = f.name
    try:
        _digest("crc32", path)  # page cache
        size = args.mb * BLOCK
        print(f"{args.mb} MiB, page cache warm, one thread, {os.cpu_count()} CPUs")
        for name in ("sha256", "blake2b", "crc32"):
            best = min(_timed(name, path) for _ in range(args.repeat))
            print(f"{name:8s} {size / best / 1e9:6.2f} GB/s   100 GB: {100e9 / (size / best):7.1f} s")
        _verify_folder(path, size, args.repeat, [int(r) for r in args.ranks.split(",")])
    finally:
        os.unlink(path)


def _verify_folder(path: str, size: int, repeat: int, ranks: list[int]) -> None:
    from pathlib import Path

    from rlctl.checkpoint.manifest import verify, write_manifest

    root = Path(tempfile.mkdtemp())
    try:
        for i in range(4):
            shutil.copyfile(path, root / f"shard-{i}.safetensors")
        write_manifest(root, 1, {})
        start = time.perf_counter()
        for _ in range(repeat):
            assert verify(root, hashes=True) == []
        took = (time.perf_counter() - start) / repeat
        rate = 4 * size / took
        print(f"verify(hashes=True), 4 files, {4 * size / 2**20:.0f} MiB: {rate / 1e9:.2f} GB/s ({took:.2f} s)")
        for r in ranks:   # each rank reads 1/r of the files, in the same threads, on its own node's CPUs
            print(f"100 GB checkpoint over {r:3d} ranks: {100e9 / r / 1e9:6.2f} GB per rank, "
                  f"{100e9 / r / rate:5.1f} s per rank at this rate")
    finally:
        shutil.rmtree(root)


def _timed(name: str, path: str) -> float:
    start = time.perf_counter()
    _digest(name, path)
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
