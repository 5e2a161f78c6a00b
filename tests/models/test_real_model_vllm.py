"""vLLM's CPU engine on SmolLM2-135M-Instruct: the log-probs it reports for its sampled tokens against the
trainer's, in float32 and bfloat16 (tests/support/vllm_real_check.py, a process of its own). These are
what `rollout.max_logprob_diff` and the rollout/logprob_diff_* metrics watch on a real run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.usefixtures("vllm_installed")]
SCRIPT = Path(__file__).resolve().parents[1] / "support" / "vllm_real_check.py"


def test_vllm_log_probs_match_the_trainer_s_on_real_weights(smollm2_dir):
    repo = str(SCRIPT.parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(SCRIPT), str(smollm2_dir)], env=env, capture_output=True, text=True,
                          timeout=900)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    report = json.loads(lines[-1].removeprefix("REPORT "))
    assert report["float32"]["tokens"] > 8 and report["bfloat16"]["tokens"] > 8
    assert report["float32"]["max"] < 1e-3, report          # one computation, two kernels: rounding only
    # bf16 on both sides, each rounding to 8-bit mantissas in its own order: a mean over the tokens, with room
    # for another CPU's kernels; a push of the wrong weights is off by nats, not tenths
    assert report["bfloat16"]["mean"] < 0.1, report
