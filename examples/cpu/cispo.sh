#!/usr/bin/env bash
# CISPO (MiniMax-M1, 2506.13585): clipped, stop-gradient IS weight on every token's log-prob.
# Trains the embedded tiny model on the built-in arithmetic task on CPU (no download, no GPU).
# Knobs: see examples/common.sh (e.g. STEPS=40 N=4 bash examples/cpu/cispo.sh); extra args are Hydra overrides.
set -euo pipefail
ALGO=cispo
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
run_rlplat "$@"
