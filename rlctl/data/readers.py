"""Read question/answer records from jsonl, json, csv and parquet files, reporting bad rows.

A bad row never stops the read: it becomes a `Problem` with `file:line` and a short `kind`, and
the caller decides (`--on-error fail|skip`). Whole-file problems (missing, empty, not parquet)
raise DataError at once.
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass, field
from pathlib import Path

from rlctl.config.loader import Problem
from rlctl.errors import DataError

SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")


def row_problem(where: str, kind: str, detail: str) -> Problem:
    """A row that could not be used: where (`file:line`), a short kind, and the detail."""
    return Problem(where, detail, kind=kind)


@dataclass
class RawFile:
    """Records of one file as (where, fields) pairs; `columns` are the header/keys seen."""

    path: Path
    records: list = field(default_factory=list)
    problems: list = field(default_factory=list)
    columns: list = field(default_factory=list)


def read_records(path: Path) -> RawFile:
    """Read one file by its suffix; DataError if it is missing, empty or of an unknown kind."""
    if not path.is_file():
        raise DataError(f"{path} does not exist or is not a file", hint="check --source.")
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise DataError(f"{path}: unknown file type {suffix!r} (expected {', '.join(SUFFIXES)})")
    if path.stat().st_size == 0:
        raise DataError(f"{path} is empty (0 bytes)", hint="check the path or re-download the file.")
    reader = {".jsonl": _read_jsonl, ".json": _read_json, ".csv": _read_csv, ".parquet": _read_parquet}
    raw = reader[suffix](path)
    if not raw.records and not raw.problems:
        raise DataError(f"{path} holds no rows", hint="check the path or re-download the file.")
    return raw


def _read_jsonl(path: Path) -> RawFile:
    raw, keys = RawFile(path), {}
    for lineno, line in enumerate(path.read_bytes().split(b"\n"), start=1):
        where = f"{path.name}:{lineno}"
        if not line.strip():
            continue  # blank lines are not rows (a trailing newline makes one)
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as e:
            raw.problems.append(row_problem(where, "not UTF-8",
                                            f"not valid UTF-8 (byte 0x{line[e.start]:02x} at column {e.start + 1})"))
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as e:
            raw.problems.append(row_problem(where, "malformed JSON", f"malformed JSON ({e.msg} at column {e.colno})"))
            continue
        if not isinstance(record, dict):
            raw.problems.append(row_problem(where, "malformed JSON",
                                            f"expected a JSON object per line, got {type(record).__name__}"))
            continue
        keys.update(dict.fromkeys(record))
        raw.records.append((where, record))
    raw.columns = list(keys)
    return raw


def _read_json(path: Path) -> RawFile:
    """A .json file: one object (the original MATH layout) or a list of objects."""
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError as e:
        raise DataError(f"{path}: not valid UTF-8 (byte offset {e.start})") from None
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: malformed JSON ({e.msg})") from None
    items = data if isinstance(data, list) else [data]
    raw = RawFile(path)
    for i, item in enumerate(items):
        where = f"{path.name}[{i}]" if isinstance(data, list) else path.name
        if isinstance(item, dict):
            raw.records.append((where, item))
            raw.columns = list(dict.fromkeys([*raw.columns, *item]))
        else:
            raw.problems.append(row_problem(where, "malformed JSON", f"expected an object, got {type(item).__name__}"))
    return raw


def _read_csv(path: Path) -> RawFile:
    # surrogateescape keeps undecodable bytes as lone surrogates, so one bad row is reported
    # on its own line instead of failing the whole file.
    text = path.read_bytes().decode("utf-8-sig", errors="surrogateescape")
    reader = csv.reader(io.StringIO(text, newline=""))
    raw = RawFile(path)
    try:
        header = next(reader)
    except StopIteration:
        header = []
    raw.columns = [h.strip() for h in header]
    if len(set(raw.columns)) != len(raw.columns):
        raise DataError(f"{path}: the header repeats a column name ({', '.join(raw.columns)})")
    for row in reader:
        where = f"{path.name}:{reader.line_num}"
        if not any(cell.strip() for cell in row):
            continue
        if any("\udc80" <= ch <= "\udcff" for cell in row for ch in cell):
            raw.problems.append(row_problem(where, "not UTF-8", "not valid UTF-8"))
        elif len(row) != len(raw.columns):
            raw.problems.append(row_problem(where, "wrong field count",
                                            f"{len(row)} fields, the header has {len(raw.columns)}"))
        else:
            raw.records.append((where, dict(zip(raw.columns, row))))
    return raw


def _read_parquet(path: Path) -> RawFile:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise DataError(f"{path} is not a readable parquet file ({str(e).splitlines()[0]})") from None
    raw = RawFile(path, columns=list(table.column_names))
    raw.records = [(f"{path.name}[{i}]", rec) for i, rec in enumerate(table.to_pylist())]
    return raw
