"""The chaos suite trains the same arith projects as tests/controller: its fixtures, shared."""

from controller.conftest import arith_data, make_project  # noqa: F401  (pytest fixtures)
