#!/usr/bin/env bash
# Fetch, into .whl/, the pure-Python wheels soakd needs that the device machine's image lacks
# (it has Python 3.12 with a CUDA torch, numpy, scipy, psutil, prometheus-client, nvidia-ml-py,
# pytest, but no APScheduler or OpenTelemetry, and no network). Run here, where PyPI answers;
# then the device call carries .whl (ignored by git) and bench/gpu_check.sh installs them
# (docs/gpu.md). About 1 MB.
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
ls .whl
