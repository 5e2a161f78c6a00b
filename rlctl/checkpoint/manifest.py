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
import json
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Callable

from rlctl import __version__
from rlctl.utils.checksum import (CHECKSUM, CHECKSUMS, MANIFEST, checksum_file, content_problems,  # noqa: F401
                                  hash_file, hash_many)
from rlctl.utils.atomic_files import atomic_write_text

CONFIG_FILE = "config.resolved.toml"   # the run's resolved config: in the run folder and in every checkpoint
FORMAT = 1


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
    hashed = hash_many([(p, CHECKSUM) for p in files], fsync=True)
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


def verify(step_dir: str | os.PathLike, *, hashes: bool, content_of: Callable[[str], bool] | None = None) -> list[str]:
    """Problems with a checkpoint folder: missing manifest, missing or truncated files, and with
    hashes=True contents that differ from the manifest's checksums. [] means the checkpoint is intact.
    content_of(path): which files' contents to check (default all; resume leaves the role folders
    to the ranks that load them, rlctl.workers.compute.checkpoint_io)."""
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
    present = [e for e in present if content_of is None or content_of(e["path"])]
    if hashes and present:
        problems += content_problems(step_dir, present)
    return problems
