"""rlctl's output has no third-party progress bars, and its log lines share one format.

The commands run as real processes WITHOUT HF_HUB_DISABLE_PROGRESS_BARS (which conftest sets for
every test), so the bars transformers draws when it writes ("Writing model shards") or loads
("Loading weights") a model would show here unless rlctl itself turns them off.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow   # starts Ray, trains a run or starts a subprocess

# tqdm's bar tail ("| 1/1 [00:00<00:00, 93.24it/s]") and the captions of transformers' bars.
BAR = re.compile(r"Loading weights|Writing model shards|Fetching \d+ files|\d+it/s\]|\d+/\d+ \[\d\d:\d\d")
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: \S")


def rlctl(*args, cwd):
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY")}
    return subprocess.run([sys.executable, "-m", "rlctl", *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          env={**env, "HF_HUB_OFFLINE": "1"}, timeout=300)


def test_model_tiny_and_eval_show_no_progress_bars_and_one_log_format(tmp_path):
    tiny = rlctl("model", "tiny", "m", "--layers", 1, "--hidden", 32, cwd=tmp_path)   # writes weights
    assert tiny.returncode == 0, tiny.stderr
    assert not BAR.search(tiny.stdout + tiny.stderr), tiny.stderr
    assert rlctl("data", "prep", "arith", cwd=tmp_path).returncode == 0
    run = rlctl("eval", "m", "--data", "data/arith/test.parquet", "--limit", 2, "--max-new-tokens", 2,
                "--engine", "hf", cwd=tmp_path)                                       # loads them
    assert run.returncode == 0, run.stderr
    assert not BAR.search(run.stdout + run.stderr), run.stderr
    lines = run.stderr.splitlines()
    assert any("generated 2/2 prompts" in line for line in lines)
    assert lines and all(LOG_LINE.match(line) for line in lines), run.stderr    # every line: date level name: text
