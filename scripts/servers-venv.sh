#!/usr/bin/env bash
# A virtual environment of their own for the third-party inference servers the tests soak
# (`transformers serve`, KServe's ModelServer), as a user's server would run: their pins never
# touch soakd's .venv. Idempotent. Tests find it at .venv-servers (SOAKD_SERVERS_VENV overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SOAKD_SERVERS_VENV:-.venv-servers}
PY=${PYTHON:-python3}
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
if ! "$VPY" -c 'import torch' 2>/dev/null; then
  # The CPU build first: a bare `torch` (pulled in by the servers) would fetch GB of CUDA wheels.
  "$VPY" -m pip install -q torch==2.13.0 2>/dev/null \
    || "$VPY" -m pip install -q torch --index-url https://download.pytorch.org/whl/cpu
fi
if ! "$VPY" -c 'import transformers, kserve, fastapi' 2>/dev/null; then
  "$VPY" -m pip install -q 'transformers[serving]' kserve
fi
# The exact-prompt tests run soakd's prompt code with this venv's `tokenizers`; soakd's config
# there needs msgspec (soakd's own dependency, which the servers do not pull in).
if ! "$VPY" -c 'import msgspec' 2>/dev/null; then
  "$VPY" -m pip install -q 'msgspec>=0.18'
fi
