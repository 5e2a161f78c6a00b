"""Write a set of files into one folder, all or nothing (`data prep`'s splits, `init`'s project, `config schema --out`).

A user's --out or DIR can be unwritable (read-only, under a file, /proc), be a file itself, or
hold a folder where a file should go. Each of these becomes one UsageError naming the path and
the OS reason; a failure leaves no file changed and removes the folders this call created.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlctl.errors import UsageError
from rlctl.utils.fs import atomic_write_bytes, is_special_file


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
