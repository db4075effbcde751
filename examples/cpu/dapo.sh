#!/usr/bin/env bash
# DAPO (2503.14476): clip-higher, token-level loss, dynamic sampling, overlong shaping, no KL.
# Trains the embedded tiny model on the built-in arithmetic task on CPU (no download, no GPU).
# Knobs: see examples/common.sh (e.g. STEPS=40 N=4 bash examples/cpu/dapo.sh); extra args are Hydra overrides.
set -euo pipefail
ALGO=dapo
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
run_rlplat "$@"
