"""The side virtual environments scripts/setup.sh makes (.venv-agents, .venv-tinker): client programs
whose dependencies are kept apart from rlctl's, which tests run as a user would."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest


def venv_python(python: Path, module: str, what: str) -> Path:
    """`python` once `module` imports in it; else a skip naming `what` (a failure under CI=true)."""
    if python.is_file() and subprocess.run([str(python), "-c", f"import {module}"], capture_output=True).returncode == 0:
        return python
    why = (f"{what} is not installed in {python.parent.parent} (bash scripts/setup.sh installs it from PyPI; "
           f"it could not reach a package index)")
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true but {why}")
    pytest.skip(why)
