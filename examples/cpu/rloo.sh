#!/usr/bin/env bash
# RLOO (2402.14740): leave-one-out baseline; KL in the reward.
# Trains the embedded tiny model on the built-in arithmetic task on CPU (no download, no GPU).
# Knobs: see examples/common.sh (e.g. STEPS=40 N=4 bash examples/cpu/rloo.sh); extra args are Hydra overrides.
set -euo pipefail
ALGO=rloo
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
run_rlplat "$@"
