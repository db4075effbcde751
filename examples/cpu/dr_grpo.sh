#!/usr/bin/env bash
# Dr. GRPO (2503.20783): no std scaling, a constant normaliser instead of |o_i|, no KL term.
# Trains the embedded tiny model on the built-in arithmetic task on CPU (no download, no GPU).
# Knobs: see examples/common.sh (e.g. STEPS=40 N=4 bash examples/cpu/dr_grpo.sh); extra args are Hydra overrides.
set -euo pipefail
ALGO=dr_grpo
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
run_rlplat "$@"
