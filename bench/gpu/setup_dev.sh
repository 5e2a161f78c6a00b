# Sourced by the gpu*.sh scripts: wheels carried in .whl/ (if any) into /tmp/site, this checkout on PYTHONPATH.
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    >/dev/null 2>&1 || { echo "error: installing the wheels in .whl/ failed" >&2; exit 1; }
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export RAY_USAGE_STATS_ENABLED=0 RAY_AUTH_MODE=disabled HF_HUB_DISABLE_PROGRESS_BARS=1 PATH=/tmp/site/bin:$PATH
rl() { python3 -m rlctl "$@"; }
