#!/usr/bin/env bash
# Fetch, into .whl/, the wheels soakd needs that the device machine's image lacks
# (it has Python 3.12 with a CUDA torch, numpy, scipy, psutil, prometheus-client, nvidia-ml-py,
# pytest, but no APScheduler or msgspec, and no network). Run here, where PyPI answers; then the
# device call carries .whl (ignored by git) and bench/gpu_check.sh installs them (docs/gpu.md).
# About 500 kB. Not OpenTelemetry: soakd imports its SDK only with OTLP on, which no step turns
# on, so leaving it out lets bench/gpu_rehearse.sh prove that (bench/gpu/imports.py's IMAGE_LACKS).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform any -d .whl \
  apscheduler==3.11.3 tzlocal==5.4.5
# msgspec (the config's and the run record's types) is a C extension: the wheel for CPython 3.12.
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 -d .whl msgspec==0.23.0
# ... and for this machine's python, which bench/gpu_rehearse.sh stands in for the image with.
"$PY" -m pip download -q --no-deps --only-binary=:all: -d .whl msgspec==0.23.0
ls .whl
