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
# .whl/ installed into /tmp/soakd-site (the device machine: CUDA torch, no network; if that still
# fails the import check, the failing import is named); else scripts/bootstrap.sh creates .venv
# (needs a package registry; pip gives up in seconds where none answers).
# bench/gpu_rehearse.sh runs this script on the CPU in a venv holding only the image's packages.
#
# Steps, each in its own process under its own timeout (typical seconds on one GPU in brackets,
# estimates until the first run): env 30 (5), pytest -m gpu 135 (60), fixtures 45 (25),
# table 120 (90), soaks 100 (60; four soakd runs side by side), costs 40 (20): 470 s, inside
# the 480 s budget. A step that fails or times out is recorded and the next one runs.
# Without CUDA each step prints "STEP: skipped: no CUDA" and the script exits 0 (CI does that).
#
# Writes OUT/gpu_check.json, OUT/gpu_check.md, OUT/gpu_check.log, OUT/fixtures/<gpu>/*.json
# (8 files: what the device tool brings back). Exit 0 passed or dry run, 1 a step failed or no
# Python imports what the steps run, 2 usage.
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

# The import check (bench/gpu/imports.py): what the steps and their soakd children import, not
# only the CLI, so a module-level import of a package the image lacks fails here, named, and not
# in every step. Its complaint is kept for the message when no Python passes it.
why=""
works() {
  why=$("$1" -m bench.gpu.imports 2>&1 >/dev/null) && return 0
  why=${why:-$1 does not start}
  return 1
}

# SOAKD_GPU_REHEARSE=1 (bench/gpu_rehearse.sh): python3 is the rehearsal's venv, standing in for
# the device image, so the checkout's .venv is not tried and nothing is bootstrapped.
rehearse=${SOAKD_GPU_REHEARSE:-}
site=${SOAKD_SITE:-/tmp/soakd-site}
py=${PYTHON:-}
if [ -z "$py" ] && [ -z "$rehearse" ] && [ -x .venv/bin/python ] && works .venv/bin/python; then py=.venv/bin/python; fi
if [ -z "$py" ] && command -v python3 >/dev/null 2>&1 && works python3; then py=python3; fi
if [ -z "$py" ] && [ -d .whl ] && command -v python3 >/dev/null 2>&1; then
  # By name from .whl (not every file): pip takes the wheel that fits this python (msgspec is
  # carried for the device's CPython 3.12 and for the rehearsal's python).
  names=$(ls .whl/*.whl | xargs -n1 basename | cut -d- -f1 | sort -u)
  # shellcheck disable=SC2086  # one argument per package name
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --find-links .whl --target "$site" $names
  export PYTHONPATH="$PYTHONPATH:$site"
  if works python3; then
    py=python3
  else  # the device path: name what is missing before anything else is tried
    echo "gpu_check: python3 with the wheels of .whl/ still fails the import check: $why" >&2
    echo "gpu_check: carry the missing package as a wheel (bench/gpu_wheels.sh) or import it where it is used" >&2
    why="see above"
  fi
fi
if [ -z "$py" ] && [ -n "$rehearse" ]; then
  echo "gpu_check: the rehearsal stops here, nothing bootstrapped; the import check said: $why" >&2
  exit 1
fi
if [ -z "$py" ]; then
  echo "gpu_check: no Python here passes the import check ($why); creating .venv (needs a package registry)" >&2
  # pip gives up in seconds, not after minutes of retries, where no registry answers (the device).
  if ! PIP_RETRIES=0 PIP_DEFAULT_TIMEOUT=10 scripts/bootstrap.sh; then
    echo "gpu_check: could not create .venv (no package registry?); the import check said: $why" >&2
    exit 1
  fi
  py=.venv/bin/python
fi
echo "gpu_check: python $("$py" -c 'import sys; print(sys.executable)')"
exec "$py" -m bench.gpu.check "$out" "$@"
