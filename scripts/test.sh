#!/usr/bin/env bash
# The README's test command: set up (idempotent), then run the CPU test suite.
# With no arguments it first runs the real-vLLM tests in their own virtualenv (scripts/setup_vllm.sh;
# RLPLAT_SKIP_VLLM=1 leaves them out), then the whole suite in .venv. There RLPLAT_REQUIRE_VLLM=1 makes
# a vllm that is missing or does not import fail those tests (tests/conftest.py) instead of skipping them,
# and the documented rollout=vllm commands run one step each (tests/config/test_doc_commands.py).
# Extra arguments go to pytest in .venv only, e.g. `bash scripts/test.sh tests/algorithms -x`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
venv="${RLPLAT_VENV:-.venv}"
if [ $# -eq 0 ] && [ -z "${RLPLAT_SKIP_VLLM:-}" ]; then
  bash scripts/setup_vllm.sh
  RLPLAT_REQUIRE_VLLM=1 "${RLPLAT_VLLM_VENV:-.venv-vllm}/bin/python" -m pytest tests/rollout tests/trainer/test_learning.py \
    tests/examples/test_scripts.py tests/tools/test_export.py tests/config/test_doc_commands.py -k vllm
fi
exec "$venv/bin/python" -m pytest "${@:-tests}"
