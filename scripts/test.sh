#!/usr/bin/env bash
# The test command of the README: set up .venv if needed, then run the whole suite (both tiers:
# the fast one alone is `pytest -m "not slow"`), printing the 25 slowest tests.
# Two pytest-xdist workers, one test file each at a time (--dist loadfile keeps a module's Ray cluster
# and fixtures in one process): a serial run leaves the cores part idle, since much of a Ray test is
# waiting for processes to start and for the other ranks (docs/benchmarks.md, "Test suite").
# --no-loadscope-reorder: files go to the workers in the order tests/conftest.py gives them (the long
# ones first, the short fast ones last to fill the end); pytest-xdist's default re-sorts them by their
# number of tests, which put a 4-minute file of 3 tests among the last.
# RLCTL_TEST_WORKERS=0 runs serially (for --pdb).
# pytest's exit code 5 (no tests collected) is a failure here, never a silent pass.
set -uo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh || exit 1
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled
.venv/bin/python -m pytest -q --durations=25 -n "${RLCTL_TEST_WORKERS:-2}" --dist loadfile --no-loadscope-reorder "$@"
rc=$?
if [ "$rc" -eq 5 ]; then
  echo "error: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
