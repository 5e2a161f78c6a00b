"""`python -m rlctl.cli` runs the CLI (the completion generator and tests use it)."""

from rlctl.cli.main import run

run()
