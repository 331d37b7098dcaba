#!/usr/bin/env bash
# soakd's GPU half on a real device, in one command (issue #18; docs/gpu.md says what it proves):
#
#   bash bench/gpu_check.sh "$OUT"                      # every step, at most 8 minutes on one GPU
#   bash bench/gpu_check.sh "$OUT" --steps soaks,costs  # rerun some steps (a second, shorter call)
#
# On the device tool: carry .whl (made here by `bash bench/gpu_wheels.sh`), timeout_s 560:
#   run(command='bash bench/gpu_check.sh "$OUT"', carry=[".whl"], timeout_s=560)
#
# Python: $PYTHON if set; else .venv/bin/python or python3 where `import soakd` and its
# dependencies work (the checkout is put first on PYTHONPATH); else python3 with the wheels of
# .whl/ installed into /tmp/soakd-site (the device machine: CUDA torch, no network); else
# scripts/bootstrap.sh creates .venv (needs a package registry).
#
# Steps, each in its own process under its own timeout (typical seconds on one GPU in brackets,
# estimates until the first run): env 30 (5), pytest -m gpu 135 (60), fixtures 45 (25),
# table 120 (90), soaks 100 (60; four soakd runs side by side), costs 40 (20): 470 s, inside
# the 480 s budget. A step that fails or times out is recorded and the next one runs.
# Without CUDA each step prints "STEP: skipped: no CUDA" and the script exits 0 (CI does that).
#
# Writes OUT/gpu_check.json, OUT/gpu_check.md, OUT/gpu_check.log, OUT/fixtures/<gpu>/*.json
# (8 files: what the device tool brings back). Exit 0 passed or dry run, 1 a step failed, 2 usage.
set -euo pipefail
if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
  echo "usage: bash bench/gpu_check.sh OUT_DIR [--steps env,pytest,...] [--budget SECONDS]" >&2
  exit 2
fi
mkdir -p "$1"
out=$(cd "$1" && pwd)
shift
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

# What the steps' soakd children import (the run session, the sweep, the samplers), not only the
# CLI: a module-level import of a package the image lacks must fail here, not in every step.
works() {
  "$1" -c 'import soakd.cli, soakd.run.session, soakd.run.sweep, soakd.telemetry.pipeline, soakd.analysis.monitor
import bench.gpu_steps, torch, pynvml, apscheduler, prometheus_client, pytest' >/dev/null 2>&1
}

py=${PYTHON:-}
if [ -z "$py" ] && [ -x .venv/bin/python ] && works .venv/bin/python; then py=.venv/bin/python; fi
if [ -z "$py" ] && command -v python3 >/dev/null 2>&1 && works python3; then py=python3; fi
if [ -z "$py" ] && [ -d .whl ] && command -v python3 >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/soakd-site .whl/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/soakd-site"
  if works python3; then py=python3; fi
fi
if [ -z "$py" ]; then
  scripts/bootstrap.sh
  py=.venv/bin/python
fi
echo "gpu_check: python $("$py" -c 'import sys; print(sys.executable)')"
exec "$py" -m bench.gpu_check "$out" "$@"
