#!/usr/bin/env bash
# Run a command and print how busy all of the machine's CPUs were meanwhile (from /proc/stat: the share
# of CPU time, over every core, that was not idle or waiting on I/O). How docs/benchmarks.md tells a
# test run that waits on processes from one that computes:
#   bash bench/cpu_busy.sh .venv/bin/python -m pytest -q -m slow
set -uo pipefail
busy_total() {
  read -r _ user nice system idle iowait irq softirq steal _ < /proc/stat
  echo "$((user + nice + system + irq + softirq + steal)) $((user + nice + system + irq + softirq + steal + idle + iowait))"
}
read -r busy0 total0 < <(busy_total)
start=$(date +%s)
"$@"
rc=$?
read -r busy1 total1 < <(busy_total)
[ "$total1" -gt "$total0" ] || total1=$((total0 + 1))
permille=$(( (busy1 - busy0) * 1000 / (total1 - total0) ))
echo "cpu_busy: $((permille / 10)).$((permille % 10))% of $(getconf _NPROCESSORS_ONLN) cores over $(( $(date +%s) - start )) s, exit $rc"
exit "$rc"
