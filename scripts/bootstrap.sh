#!/usr/bin/env bash
# Create .venv and install soakd with its test tools. Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
if ! "$VPY" -c 'import torch' 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    "$VPY" -m pip install -q torch                       # a CUDA build on a GPU host
  else
    # CPU hosts: the CPU build (a bare `torch` would pull several GB of CUDA wheels).
    "$VPY" -m pip install -q torch==2.13.0 2>/dev/null \
      || "$VPY" -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
  fi
fi
if ! "$VPY" -c 'import soakd, pytest, scipy, PIL' 2>/dev/null || [ pyproject.toml -nt .venv/.soakd-installed ]; then
  "$VPY" -m pip install -q -e '.[dev]'
  touch .venv/.soakd-installed
fi
