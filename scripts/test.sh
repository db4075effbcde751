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
with_vllm=""
[ $# -eq 0 ] && [ -z "${RLPLAT_SKIP_VLLM:-}" ] && with_vllm=1
if [ -n "$with_vllm" ]; then  # the two virtualenvs install side by side (one pip each, 2 cores)
  bash scripts/setup_vllm.sh &
  setup_vllm=$!
fi
bash scripts/setup.sh
[ -z "$with_vllm" ] || wait "$setup_vllm"
venv="${RLPLAT_VENV:-.venv}"
if [ -z "${RLPLAT_CACHE:-}" ]; then
  RLPLAT_CACHE="$(mktemp -d)"
  trap 'rm -rf "$RLPLAT_CACHE"' EXIT
  export RLPLAT_CACHE
fi
# Both sessions spread their test modules over 2 pytest-xdist workers (the vLLM session alone left a third of the
# cores idle: its engines start in one process; 173-178 s on 2 workers against 214-249 s in one, docs/testing.md).
if [ -n "$with_vllm" ]; then
  RLPLAT_REQUIRE_VLLM=1 "${RLPLAT_VLLM_VENV:-.venv-vllm}/bin/python" -m pytest -n 2 --dist loadscope \
    tests/rollout tests/trainer/test_learning.py tests/examples/test_scripts.py tests/tools/test_export.py \
    tests/config/test_doc_commands.py -k vllm --durations=10
fi
# The whole suite runs on RLPLAT_TEST_WORKERS pytest-xdist workers (default 2: about 1.3x faster on 2 cores, as
# Ray start-up, process spawns and imports leave a core idle), each test module on one worker so its fixtures
# are built once; a run of chosen tests (arguments given) stays in one process unless the variable is set.
workers="${RLPLAT_TEST_WORKERS:-$([ $# -eq 0 ] && echo 2 || echo 1)}"
# Idle OpenMP threads sleep instead of spinning: the workers share the cores, and a process computing with more
# threads than its share (the embedded mixture of experts' warm start takes every core) otherwise spins against the
# other worker (that warm start: 76 s beside a busy core, 39 s with this; the same model; docs/testing.md).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-PASSIVE}"
parallel=()
[ "$workers" -gt 1 ] && parallel=(-n "$workers" --dist loadscope)
"$venv/bin/python" -m pytest "${parallel[@]}" --durations=15 "${@:-tests}"  # the 15 slowest tests, for the budgets of docs/testing.md
