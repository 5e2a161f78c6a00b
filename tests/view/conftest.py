"""A real multi-turn run for the view tests (tests/support/calc_run.py): 2 steps, made once per session."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.calc_run import make_calc_run


@pytest.fixture(scope="session")
def calc_run(tiny_model_dir, tmp_path_factory, _shared_ray) -> Path:
    """The run folder of a real 2-step multi-turn GRPO run whose policy calls the calculator, trained in the
    session's shared Ray (tests/conftest.py)."""
    _shared_ray.start()
    return make_calc_run(tmp_path_factory.mktemp("view_run"), tiny_model_dir, steps=2)
