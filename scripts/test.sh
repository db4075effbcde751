#!/usr/bin/env bash
# The README's test command: set up (idempotent), then run the CPU test suite.
# With no arguments it first runs the real-vLLM tests in their own virtualenv (scripts/setup_vllm.sh;
# RLPLAT_SKIP_VLLM=1 leaves them out), then the whole suite in .venv.
# Extra arguments go to pytest in .venv only, e.g. `bash scripts/test.sh tests/algorithms -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
venv="${RLPLAT_VENV:-.venv}"
if [ $# -eq 0 ] && [ -z "${RLPLAT_SKIP_VLLM:-}" ]; then
  bash scripts/setup_vllm.sh
  "${RLPLAT_VLLM_VENV:-.venv-vllm}/bin/python" -m pytest tests/rollout tests/trainer/test_learning.py tests/examples/test_scripts.py \
    tests/tools/test_export.py -k vllm
fi
exec "$venv/bin/python" -m pytest "${@:-tests}"
