#!/usr/bin/env bash
# The README's test command: set up (idempotent), then run the CPU test suite.
# With no arguments it first runs the real-vLLM tests in their own virtualenv (scripts/setup_vllm.sh;
# RLPLAT_SKIP_VLLM=1 leaves them out), then the whole suite in .venv. There RLPLAT_REQUIRE_VLLM=1 makes
# a vllm that is missing or does not import fail those tests (tests/conftest.py) instead of skipping them,
# and the documented rollout=vllm commands run one step each (tests/config/test_doc_commands.py).
# Extra arguments go to pytest in .venv only, e.g. `bash scripts/test.sh tests/algorithms -x`.
# Both pytest runs share one cache for the embedded model (tests/conftest.py embedded_cache), so its SFT warm
# start runs once per invocation; the cache is removed at the end unless RLPLAT_CACHE names one.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
venv="${RLPLAT_VENV:-.venv}"
if [ -z "${RLPLAT_CACHE:-}" ]; then
  RLPLAT_CACHE="$(mktemp -d)"
  trap 'rm -rf "$RLPLAT_CACHE"' EXIT
  export RLPLAT_CACHE
fi
if [ $# -eq 0 ] && [ -z "${RLPLAT_SKIP_VLLM:-}" ]; then
  bash scripts/setup_vllm.sh
  RLPLAT_REQUIRE_VLLM=1 "${RLPLAT_VLLM_VENV:-.venv-vllm}/bin/python" -m pytest tests/rollout tests/trainer/test_learning.py \
    tests/examples/test_scripts.py tests/tools/test_export.py tests/config/test_doc_commands.py -k vllm --durations=10
fi
"$venv/bin/python" -m pytest --durations=15 "${@:-tests}"  # the 15 slowest tests, for the budgets of docs/testing.md
