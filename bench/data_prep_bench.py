#!/usr/bin/env python3
"""Data prep speed: all of GSM8K (7,473 + 1,319 rows) from local jsonl to verl parquet.

  .venv/bin/python bench/data_prep_bench.py [--source ../shared/data/gsm8k] [--reps 5]

Times `rlctl.tasks.prep.prepare("gsm8k", ...)` in-process: read, convert, dedupe, build the
Arrow tables, write both parquet files atomically. The first rep includes importing pyarrow
(what a fresh `rlctl data prep` pays after interpreter start); the median is over all reps.
Target: under 2 s wall, excluding interpreter start.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--source", default=str(REPO.parent / "shared" / "data" / "gsm8k"))
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()

    start = time.perf_counter()
    from rlctl.tasks.prep import PrepOptions, prepare  # the import is part of the first rep

    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            t0 = start if rep == 0 else time.perf_counter()
            report = prepare("gsm8k", PrepOptions(source=args.source, out=Path(tmp) / "gsm8k", force=True))
            times.append(time.perf_counter() - t0)
    rows = {split: info["rows"] for split, info in report["splits"].items()}
    print(f"gsm8k prep {rows}: first (with imports) {times[0]:.3f} s, "
          f"median {statistics.median(times):.3f} s, min {min(times):.3f} s over {args.reps} reps "
          f"(target < 2 s)")


if __name__ == "__main__":
    main()
