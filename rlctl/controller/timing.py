"""`phase`: how long a part of a step took, added up under `timing/<name>_s` in the step's metrics."""

from __future__ import annotations

import time
from contextlib import contextmanager


@contextmanager
def phase(timing: dict, name: str):
    start = time.perf_counter()
    yield
    timing[f"timing/{name}_s"] = timing.get(f"timing/{name}_s", 0.0) + time.perf_counter() - start
