"""Atomic file writes: a reader (or a crash) never sees a half-written file.

One file (`atomic_write_bytes` / `atomic_write_text`), or a set of files into one folder, all or
nothing (`write_files`: `data prep`'s splits, `init`'s project, `config schema --out`). A user's
--out or DIR can be unwritable (read-only, under a file, /proc), be a file itself, or hold a
folder where a file should go; `write_files` turns each into one UsageError naming the path and
the OS reason, leaves no file changed and removes the folders it created.
"""

from __future__ import annotations

import errno
import os
import stat
import tempfile
from pathlib import Path

from rlctl.errors import UsageError


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


def write_files(folder: Path, files: dict[str, bytes], *, hint: str) -> list[Path]:
    """Write {name: bytes} into `folder` (created if missing); returns the paths written.

    Every file is first staged (fsynced) next to its target, then all are renamed in: a full
    disk or a refused write halfway through leaves the old files, not a mix of old and new.
    """
    folder = Path(folder)
    targets = {folder / name: data for name, data in files.items()}
    _check_targets(folder, targets, hint)
    made = _make_folder(folder, hint)
    staged, current = [], folder
    try:
        for current, data in targets.items():
            tmp = current.with_name(f".{current.name}.staged")
            atomic_write_bytes(tmp, data)
            staged.append((tmp, current))
        for tmp, current in staged:
            os.replace(tmp, current)  # same folder, target checked not to be a folder: cannot fail halfway
    except OSError as e:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        _remove_empty(made)
        raise UsageError(f"cannot write {current} ({e.strerror or e})", hint=hint) from None
    return list(targets)


def _check_targets(folder: Path, targets: dict, hint: str) -> None:
    """What the OS would refuse only after some files were written: check it before any."""
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"cannot write into {folder}: it is a file, not a folder", hint=hint)
    for path in targets:
        if path.is_dir():
            raise UsageError(f"cannot write {path}: a folder of that name is in the way", hint=hint)
        if is_special_file(path):   # renaming over it would replace a device or pipe with a plain file
            raise UsageError(f"cannot write {path}: it is a device or pipe, not a file", hint=hint)


def _make_folder(folder: Path, hint: str) -> list[Path]:
    """mkdir -p `folder`; returns the folders it created, deepest first (to undo on failure)."""
    missing = [p for p in (folder, *folder.parents) if not p.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _remove_empty(missing)
        raise UsageError(f"cannot create folder {folder} ({e.strerror or e})", hint=hint) from None
    return missing


def _remove_empty(folders: list[Path]) -> None:
    for path in folders:  # deepest first; a folder something else wrote into stays
        try:
            path.rmdir()
        except OSError:
            pass
