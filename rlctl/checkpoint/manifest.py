"""MANIFEST.json: what a complete checkpoint folder holds, written last inside it.

    {"format": 1, "step": 12, "created_at": "...", "world_size": 2, "world_sizes": {"actor": 2},
     "versions": {"rlctl": ..., "torch": ..., "transformers": ..., "python": ...},
     "bytes": 123456, "files": [{"path": "actor/model/shard-....safetensors", "size": N, "crc32": "1a2b3c4d"}],
     "meta": {...}}                      # whatever the trainer passed (e.g. the resume fingerprint)

A folder is a checkpoint only once its manifest exists; `verify` compares the folder with it
(presence and sizes always, contents on request). Contents are checked with zlib.crc32, the fastest
stdlib checksum here (bench/checksum_bench.py: 3.4 GB/s a thread against sha256's 1.6 and
blake2b's 0.9): it guards against corruption, not tampering. Manifests written before it carry
"sha256" per file, which `verify` still reads. Hashing streams 1 MiB blocks in a few threads (zlib
and hashlib release the GIL on large buffers), and fsyncs each file it reads, so building the
manifest also makes the checkpoint durable before it is renamed into place.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import platform
import zlib
from concurrent.futures import ThreadPoolExecutor
from importlib import metadata
from pathlib import Path

from rlctl import __version__
from rlctl.utils.fs import atomic_write_text

MANIFEST = "MANIFEST.json"
CONFIG_FILE = "config.resolved.toml"   # the run's resolved config: in the run folder and in every checkpoint
FORMAT = 1
BLOCK = 1 << 20
CHECKSUM = "crc32"                   # what write_manifest records per file
CHECKSUMS = ("crc32", "sha256")      # what verify reads, first found wins (sha256: older manifests)


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


def _hash_many(jobs: list[tuple[Path, str]], *, fsync: bool) -> list[tuple[int, str]]:
    """checksum_file over (path, algorithm) pairs, a few files at a time."""
    workers = max(1, min(8, os.cpu_count() or 1, len(jobs)))
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda job: checksum_file(job[0], job[1], fsync=fsync), jobs))


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in `path` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and p.relative_to(root).as_posix() != MANIFEST)


def _versions() -> dict[str, str]:
    out = {"rlctl": __version__, "python": platform.python_version()}
    for package in ("torch", "transformers", "peft"):
        try:
            out[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            out[package] = ""
    return out


def _world_sizes(root: Path) -> dict[str, int]:
    """Ranks each role was saved with, from the engines' engine.json (actor/, critic/)."""
    sizes = {}
    for engine_json in sorted(root.glob("*/engine.json")):
        try:
            sizes[engine_json.parent.name] = int(json.loads(engine_json.read_text())["world_size"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return sizes


def write_manifest(root: Path, step: int, meta: dict) -> dict:
    """Hash and fsync every file under `root`, then write root/MANIFEST.json (atomically) and
    fsync the folders, so the whole checkpoint is on disk before anyone renames it."""
    files = _files(root)
    hashed = _hash_many([(p, CHECKSUM) for p in files], fsync=True)
    sizes = _world_sizes(root)
    manifest = {
        "format": FORMAT, "step": int(step),
        "created_at": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "world_size": max(sizes.values(), default=None), "world_sizes": sizes,
        "versions": _versions(), "bytes": sum(size for size, _ in hashed),
        "files": [{"path": p.relative_to(root).as_posix(), "size": size, CHECKSUM: checksum}
                  for p, (size, checksum) in zip(files, hashed)],
        "meta": meta,
    }
    atomic_write_text(root / MANIFEST, json.dumps(manifest, indent=1) + "\n")
    for folder in sorted({p.parent for p in files} | {root}, key=lambda p: len(p.parts), reverse=True):
        fsync_dir(folder)
    return manifest


def read_manifest(step_dir: Path) -> dict:
    """The parsed manifest; ValueError (with the reason) when it is missing or unreadable."""
    try:
        manifest = json.loads((Path(step_dir) / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ValueError(f"{MANIFEST} is missing (the save did not finish)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f"{MANIFEST} is unreadable ({err})") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), list):
        raise ValueError(f"{MANIFEST} has no file list")
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{MANIFEST} has format {manifest.get('format')!r}; this rlctl reads {FORMAT}")
    return manifest


def verify(step_dir: str | os.PathLike, *, hashes: bool) -> list[str]:
    """Problems with a checkpoint folder: missing manifest, missing or truncated files, and with
    hashes=True contents that differ from the manifest's checksums. [] means the checkpoint is intact."""
    step_dir = Path(step_dir)
    try:
        manifest = read_manifest(step_dir)
    except ValueError as err:
        return [str(err)]
    problems, present = [], []
    for entry in manifest["files"]:
        path = step_dir / entry["path"]
        try:
            size = path.stat().st_size
        except OSError:
            problems.append(f"{entry['path']} is missing")
            continue
        if size != entry["size"]:
            problems.append(f"{entry['path']} is {size} bytes, the manifest says {entry['size']} (truncated or replaced)")
        else:
            present.append(entry)
    if hashes and present:
        problems += _content_problems(step_dir, present)
    return problems


def _content_problems(step_dir: Path, entries: list[dict]) -> list[str]:
    """Files whose checksum differs from their manifest entry's (crc32, or sha256 in older manifests)."""
    problems, jobs = [], []
    for entry in entries:
        algorithm = next((a for a in CHECKSUMS if isinstance(entry.get(a), str)), None)
        if algorithm is None:
            problems.append(f"{entry['path']} has no checksum in the manifest ({' or '.join(CHECKSUMS)})")
        else:
            jobs.append((entry, algorithm))
    hashed = _hash_many([(step_dir / e["path"], a) for e, a in jobs], fsync=False)
    for (entry, algorithm), (_, checksum) in zip(jobs, hashed):
        if checksum != entry[algorithm]:
            problems.append(f"{entry['path']} does not match its {algorithm} in the manifest (corrupted)")
    return problems
