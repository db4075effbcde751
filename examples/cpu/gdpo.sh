#!/usr/bin/env bash
# GDPO (2601.05242): each reward function's term normalised within its group, then the weighted sum whitened.
# Trains the embedded tiny model on the built-in arithmetic task on CPU (no download, no GPU).
# Knobs: see examples/common.sh (e.g. STEPS=40 N=4 bash examples/cpu/gdpo.sh); extra args are Hydra overrides.
set -euo pipefail
ALGO=gdpo
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
run_rlplat "$@"
