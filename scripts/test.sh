#!/usr/bin/env bash
# The README's test command: set up (idempotent), then run the CPU test suite.
# With no arguments it runs the real-vLLM tests in their own virtualenv (scripts/setup_vllm.sh; RLPLAT_SKIP_VLLM=1
# leaves them out) beside the whole suite in .venv, and exits non-zero if either fails. There RLPLAT_REQUIRE_VLLM=1 makes
# a vllm that is missing or does not import fail those tests (tests/conftest.py) instead of skipping them,
# and the documented rollout=vllm commands run one step each (tests/config/test_doc_commands.py).
# Extra arguments go to pytest in .venv only, e.g. `bash scripts/test.sh tests/algorithms -x`.
# Both pytest runs share one cache for the embedded model (tests/conftest.py embedded_cache), so its SFT warm
# start runs once per invocation; the cache is removed at the end unless RLPLAT_CACHE names one.
set -euo pipefail
cd "$(dirname "$0")/.."
with_vllm=""
[ $# -eq 0 ] && [ -z "${RLPLAT_SKIP_VLLM:-}" ] && with_vllm=1
venv="${RLPLAT_VENV:-.venv}"
vllm_venv="${RLPLAT_VLLM_VENV:-.venv-vllm}"
vllm_session=""
cleanup() {
  [ -z "$vllm_session" ] || kill -- -"$vllm_session" 2>/dev/null || true
  [ -z "${own_cache:-}" ] || rm -rf "$RLPLAT_CACHE"
}
trap cleanup EXIT
if [ -z "${RLPLAT_CACHE:-}" ]; then
  RLPLAT_CACHE="$(mktemp -d)"
  own_cache=1
  export RLPLAT_CACHE
fi
if [ -n "$with_vllm" ]; then
  # The vLLM session (set-up included) runs beside the main one, in a process group of its own: alone it leaves
  # ~40% of the 2 cores idle (engine starts, one process), which the main session's workers use. Its output is
  # kept in a file and printed after the main session's.
  vllm_log="$RLPLAT_CACHE/vllm-session.log"
  echo "[test] the vLLM session runs beside the main one in $vllm_venv; its output follows the main session's"
  # a Ray temporary directory of its own: a Ray cluster one session starts is never the one the other joins
  mkdir -p "$RLPLAT_CACHE/ray"
  set -m
  (bash scripts/setup_vllm.sh && RAY_TMPDIR="$RLPLAT_CACHE/ray" RLPLAT_REQUIRE_VLLM=1 "$vllm_venv/bin/python" -m pytest tests/rollout \
    tests/trainer/test_learning.py tests/examples/test_scripts.py tests/tools/test_export.py \
    tests/config/test_doc_commands.py -k vllm --durations=10) > "$vllm_log" 2>&1 &
  vllm_session=$!
  set +m
fi
bash scripts/setup.sh
# The whole suite runs on RLPLAT_TEST_WORKERS pytest-xdist workers (default 2: about 1.3x faster on 2 cores, as
# Ray start-up, process spawns and imports leave a core idle), each test module on one worker so its fixtures
# are built once; a run of chosen tests (arguments given) stays in one process unless the variable is set.
workers="${RLPLAT_TEST_WORKERS:-$([ $# -eq 0 ] && echo 2 || echo 1)}"
parallel=()
[ "$workers" -gt 1 ] && parallel=(-n "$workers" --dist loadscope)
status=0
"$venv/bin/python" -m pytest "${parallel[@]}" --durations=15 "${@:-tests}" || status=$?  # the 15 slowest tests: docs/testing.md
if [ -n "$vllm_session" ]; then
  vllm_status=0
  wait "$vllm_session" || vllm_status=$?
  vllm_session=""
  echo "[test] the vLLM session ($vllm_venv), exit status $vllm_status:"
  cat "$vllm_log"
  [ "$status" -ne 0 ] || status=$vllm_status
fi
exit "$status"
