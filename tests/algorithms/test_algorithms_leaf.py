"""rlctl.algorithms stays a leaf: it imports only torch, numpy, the stdlib and itself."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import rlctl.algorithms

PACKAGE = Path(rlctl.algorithms.__file__).parent
ALLOWED = {"torch", "numpy"} | set(sys.stdlib_module_names)


def test_imports_are_torch_numpy_stdlib_or_relative():
    offenders = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                roots = [alias.name.split(".")[0] for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                roots = [node.module.split(".")[0]]
            else:
                continue
            offenders += [f"{path.name}: {root}" for root in roots if root not in ALLOWED]
    assert offenders == []
    assert len(list(PACKAGE.glob("*.py"))) >= 8
