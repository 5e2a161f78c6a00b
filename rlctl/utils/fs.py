"""Atomic file writes: a reader (or a crash) never sees a half-written file."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def _read_umask() -> int:
    mask = os.umask(0o022)   # there is no getter; read it once, at import (single-threaded)
    os.umask(mask)
    return mask


_UMASK = _read_umask()
FILE_MODE = 0o666 & ~_UMASK   # what open() gives a new file: readable by others unless the umask says no


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write to a temp file in the same folder, fsync, then rename over `path`.

    The file gets the mode a plain open() would give it (0666 less the umask, or the mode of the
    file it replaces), not mkstemp's private 0600."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        try:
            mode = path.stat().st_mode & 0o7777
        except OSError:
            mode = FILE_MODE
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode("utf-8"))
