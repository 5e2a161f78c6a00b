"""The real vLLM engine on CPU with a mixture-of-experts policy trained with its experts split over two
gloo ranks (actor.expert_parallel_size = 2): the push gathers every expert, after it vLLM's log-probs of
its greedy tokens equal the trainer's, and a push of one rank's share of a bank is refused.

Tiny Qwen3-MoE (4 experts, top-2, `--hidden 128`: head size 32, which vLLM's CPU attention runs); the
engine starts on a second model of the same shapes, so only a complete push makes it match. Two
ranks in a child process (tests/support/vllm_moe_check.py), each with its own engine. Skipped
without vllm; a failure under CI=true (tests/conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow, pytest.mark.usefixtures("vllm_installed")]
SCRIPT = Path(__file__).resolve().parents[2] / "support" / "vllm_moe_check.py"


@pytest.fixture(scope="module")
def ranks(vllm_installed, tmp_path_factory) -> list[dict]:
    from rlctl.models.tiny import build_tiny_model

    folders = []
    for seed in (0, 1):   # the trained policy, and the engine's start: same shapes, other weights
        folders.append(tmp_path_factory.mktemp(f"tiny_moe_128_{seed}"))
        build_tiny_model(folders[-1], arch="qwen3_moe", layers=2, hidden=128, seed=seed)
    repo = str(SCRIPT.parents[2])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([repo, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(SCRIPT), *map(str, folders)], env=env, capture_output=True,
                          text=True, timeout=500)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("REPORT "))["ranks"]


def _flat(rows) -> np.ndarray:
    return np.concatenate([np.asarray(r, dtype=np.float64) for r in rows])


def test_after_a_push_from_split_experts_vllm_s_log_probs_equal_the_trainer_s(ranks):
    for rank in ranks:
        assert rank["experts_here"] == 2   # each trainer rank holds 2 of the 4 experts
        got, want = _flat(rank["vllm"]), _flat(rank["trainer"])
        assert len(got) == len(want) > 0
        assert np.abs(got - want).max() < 1e-4   # fp32: ~5e-7 measured; a missing or stale expert is > 1e-2
        before = _flat([r[:len(t)] for r, t in zip(rank["before_push"], rank["trainer"])])
        assert np.abs(before - want).max() > 1e-2   # the engine started on other weights: the push made it


def test_a_push_of_one_rank_s_share_of_the_experts_is_refused(ranks):
    for rank in ranks:
        assert rank["partial_push"].startswith("the vLLM engine's weights are half-loaded")
        assert ("model.layers.0.mlp.experts.gate_up_proj holds 2 of the engine's 4 experts: refusing to load a "
                "partial expert set") in rank["partial_push"]
