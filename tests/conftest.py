"""Shared fixtures. Nothing here touches a model or dataset hub: models are built locally."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Keep the 2-core CI machine usable: one torch thread per process, no hub, quiet Ray.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RLCTL_SHARED", REPO.parent / "shared"))


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.is_dir():
        pytest.fail(f"../shared not found at {SHARED}; set RLCTL_SHARED to its path")
    return SHARED


@pytest.fixture(scope="session")
def gsm8k_dir(shared_dir) -> Path:
    return shared_dir / "data" / "gsm8k"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A 2-layer, hidden-64 Qwen2 with tied embeddings, built once per test session."""
    from rlctl.models.tiny import build_tiny_model

    out = tmp_path_factory.mktemp("tiny_model")
    build_tiny_model(out, layers=2, hidden=64, heads=4, kv_heads=2, seed=0)
    return out


@pytest.fixture(scope="session")
def tiny_untied_model_dir(tmp_path_factory) -> Path:
    from rlctl.models.tiny import build_tiny_model

    out = tmp_path_factory.mktemp("tiny_untied")
    build_tiny_model(out, layers=2, hidden=64, heads=4, kv_heads=2, tie_embeddings=False, seed=1)
    return out
