"""One writer per run folder: `rlctl train`, `resume` and `merge` hold an OS lock on the folder.

    with RunLock.acquire(run_dir, "resume"):   # UsageError (exit 2) when another process holds it
        ...

The lock is `flock(LOCK_EX | LOCK_NB)` on the run folder itself (an fd opened read-only on the
directory), held for as long as the fd is open. The kernel drops it when the process ends, however it
ends (kill -9 included), so no stale lock file can outlive a run, and a refused command writes no
file: it only opened a directory. The fd is not inherited by exec'd children (Ray's processes, the
spawned reward pool), so a lock never outlives its controller through them. `rlctl status` and
`rlctl view` never take the lock: reading a live run is always allowed.

The lock is on the folder's inode, not its name: a user who deletes (or moves) a live run's folder
and starts a new run of the same name gets a new folder and its own lock, while the old process
still holds the old one. So every write of run.json and of a checkpoint first asks
`check_run_folder(run_dir)` whether the folder at that path is still the one this process locked;
when it is not, the old process stops with one line (RunFolderGone, exit 3) instead of writing into
the new run's folder.

Caveat: flock is advisory and local. Two machines writing one folder on a network file system
may not see each other's locks (NFS maps flock to its own byte-range locks on Linux >= 2.6.12).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from pathlib import Path

from rlctl.errors import DataError, UsageError

_HELD: dict[str, RunLock] = {}   # absolute run folder path -> this process's lock on it


class RunFolderGone(DataError):
    """The folder at a locked run's path was deleted or replaced while the run was live."""


class RunLock:
    """An exclusive lock on a run folder, held until release() (or the process's end)."""

    def __init__(self, run_dir: Path, fd: int):
        self.run_dir = run_dir
        self._fd: int | None = fd
        held = os.fstat(fd)
        self._path, self._identity = os.path.abspath(run_dir), (held.st_dev, held.st_ino)
        _HELD[self._path] = self

    @classmethod
    def acquire(cls, run_dir: str | os.PathLike, command: str) -> RunLock:
        """Lock `run_dir` (an existing folder) for `command`, or refuse in one line (exit 2)."""
        run_dir = Path(run_dir)
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise
            raise UsageError(f"run folder {run_dir} is in use by {holder(run_dir)}, so `rlctl {command}` would "
                             f"write over a live run (nothing was touched)",
                             hint="wait for it to end (`rlctl status` shows its progress) or stop it with Ctrl-C, "
                                  "or pick another run.name") from None
        return cls(run_dir, fd)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)   # closing the last fd of the open file drops the flock
            self._fd = None
            if _HELD.get(self._path) is self:
                del _HELD[self._path]

    def check(self) -> None:
        """RunFolderGone unless the folder at run_dir is still the one this lock holds."""
        try:
            now = os.stat(self._path)
            same = (now.st_dev, now.st_ino) == self._identity
        except FileNotFoundError:
            same, now = False, None
        if not same:
            what = "deleted" if now is None else "replaced by another folder"
            raise RunFolderGone(f"run folder {self.run_dir} was {what} while this run was writing it; "
                                "stopping without writing into the folder now at that path",
                                hint="its checkpoints went with it: start the run again (rlctl train), "
                                     "under another run.name if the new folder is another run's")

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def check_run_folder(run_dir: str | os.PathLike) -> None:
    """Before writing into `run_dir`: RunFolderGone when this process holds its lock and the folder
    there is no longer the locked one (a process that holds no lock on it: nothing to check)."""
    lock = _HELD.get(os.path.abspath(run_dir))
    if lock is not None and lock.held:
        lock.check()


def holder(run_dir: Path) -> str:
    """Who holds the lock, as far as run.json tells (pid and command), for the refusal's message.
    (run.json is read here, not through run_folder, which imports merge, which takes this lock.)"""
    try:
        info = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        info = {}
    if isinstance(info, dict) and info.get("pid") and info.get("status") == "running":
        return f"a running `rlctl {info.get('command', 'train')}` (pid {info['pid']} on {info.get('host', '?')})"
    return "another rlctl process"
