#!/usr/bin/env bash
# One check, as CI runs it: ruff (lint and format) and strict mypy over soakd/, tests/ and bench/.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${VENV:-.venv}/bin
"$BIN/ruff" check soakd tests bench deploy grafana
"$BIN/ruff" format --check soakd tests bench deploy grafana
"$BIN/mypy"
