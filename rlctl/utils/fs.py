"""Atomic file writes: a reader (or a crash) never sees a half-written file."""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path


def _read_umask() -> int:
    mask = os.umask(0o022)   # there is no getter; read it once, at import (single-threaded)
    os.umask(mask)
    return mask


_UMASK = _read_umask()
FILE_MODE = 0o666 & ~_UMASK   # what open() gives a new file: readable by others unless the umask says no
DIR_MODE = 0o777 & ~_UMASK    # what mkdir() gives a new folder (mkdtemp's is a private 0700)


def is_special_file(path: str | os.PathLike) -> bool:
    """True for an existing device, FIFO or socket (`--out /dev/null`, `/dev/stdout`, a named pipe):
    something to write into, never to rename over (that would put a plain file where /dev/null was)."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write to a temp file in the same folder, fsync, then rename over `path`.

    The file gets the mode a plain open() would give it (0666 less the umask, or the mode of the
    file it replaces), not mkstemp's private 0600. A device, FIFO or socket at `path` is written
    into directly: there is no half-written state to protect, and renaming would replace it."""
    path = Path(path)
    if is_special_file(path):
        with open(path, "wb") as f:
            f.write(data)
        return
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


# A write that failed for lack of room or permission: disk full, quota, a file-size limit
# (RLIMIT_FSIZE), a read-only or forbidden folder.
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM, errno.EROFS})


def write_failure(err: BaseException) -> OSError | None:
    """The OSError of a failed write behind `err`, or None: `err` itself, its causes, and the
    per-rank failures torch.distributed.checkpoint gathers into a CheckpointException."""
    todo, seen = [err], set()
    while todo:
        e = todo.pop()
        if not isinstance(e, BaseException) or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in WRITE_ERRNOS:
            return e
        todo += [e.__cause__, e.__context__]
        failures = getattr(e, "failures", None)   # {rank: exception or (exception, traceback)}
        for failure in failures.values() if isinstance(failures, dict) else ():
            todo += list(failure) if isinstance(failure, tuple) else [failure]
    return None
