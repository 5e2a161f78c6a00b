"""`python -m rlctl` runs the CLI."""

from rlctl.cli.main import run

run()
