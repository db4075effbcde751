#!/usr/bin/env bash
# The README's test command: set up (idempotent), then run the CPU test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh tests/algorithms -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
venv="${RLPLAT_VENV:-.venv}"
exec "$venv/bin/python" -m pytest "${@:-tests}"
