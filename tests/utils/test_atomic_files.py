"""Atomic writes never rename over a device or pipe: `--out /dev/null` once replaced this machine's
/dev/null with a plain file (eval's output was written to a temp file and renamed over the target).
The tests use a FIFO in tmp_path, never the real /dev/null, so a regression cannot break the host."""

from __future__ import annotations

import os
import stat
import threading

import pytest

from rlctl.errors import UsageError
from rlctl.utils.atomic_files import atomic_write_text, is_special_file, write_files


def _reader(path, got):
    with open(path, "rb") as f:
        got.append(f.read())


def test_a_pipe_is_written_into_and_stays_a_pipe(tmp_path):
    fifo = tmp_path / "out"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=_reader, args=(fifo, got))
    reader.start()
    atomic_write_text(fifo, "hello\n")
    reader.join(timeout=10)
    assert got == [b"hello\n"]
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and is_special_file(fifo)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]   # no temp file left beside it


def test_regular_files_are_still_replaced_atomically(tmp_path):
    target = tmp_path / "f.txt"
    target.write_text("old")
    atomic_write_text(target, "new")
    assert target.read_text() == "new" and not is_special_file(target) and not is_special_file(tmp_path / "none")


def test_write_files_refuses_a_pipe_in_the_way(tmp_path):
    os.mkfifo(tmp_path / "train.parquet")
    with pytest.raises(UsageError, match="is a device or pipe, not a file"):
        write_files(tmp_path, {"train.parquet": b"x"}, hint="choose another --out")
    assert stat.S_ISFIFO(os.stat(tmp_path / "train.parquet").st_mode)
