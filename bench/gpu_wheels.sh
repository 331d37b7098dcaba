#!/usr/bin/env bash
# Fetch, into .whl/, the wheels soakd needs that the device machine's image lacks
# (it has Python 3.12 with a CUDA torch, numpy, scipy, psutil, prometheus-client, nvidia-ml-py,
# pytest, but no APScheduler, OpenTelemetry or msgspec, and no network). Run here, where PyPI
# answers; then the device call carries .whl (ignored by git) and bench/gpu_check.sh installs
# them (docs/gpu.md). About 1.5 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform any -d .whl \
  apscheduler==3.11.3 tzlocal==5.4.5 \
  opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 opentelemetry-proto==1.45.2 \
  opentelemetry-semantic-conventions==0.66b2 opentelemetry-exporter-otlp-proto-http==1.45.2 \
  opentelemetry-exporter-otlp-proto-common==1.45.2 opentelemetry-exporter-http-transport==0.66b2 \
  opentelemetry-exporter-otlp-common==0.66b2 googleapis-common-protos==1.76.0
# msgspec (the config's types and bounds) is a C extension: the wheel for the image's CPython 3.12.
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_17_x86_64 -d .whl msgspec==0.23.0
ls .whl
