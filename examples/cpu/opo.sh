#!/usr/bin/env bash
# OPO (2505.23585): exact on-policy updates with a length-weighted group baseline, no KL.
# Trains the embedded tiny model on the built-in arithmetic task on CPU (no download, no GPU).
# Knobs: see examples/common.sh (e.g. STEPS=40 N=4 bash examples/cpu/opo.sh); extra args are Hydra overrides.
set -euo pipefail
ALGO=opo
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
run_rlplat "$@"
