"""verl-schema rows written straight to parquet, for tests that need a few hand-made prompts."""

from __future__ import annotations

from pathlib import Path


def write_rows(path: Path, rows: list[dict]) -> Path:
    """verl-schema rows (data_source, prompt, reward_model, extra_info) to parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path
