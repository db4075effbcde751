#!/usr/bin/env bash
# ReMax (2310.10505): the greedy response's score is the baseline; KL in the reward.
# Trains the embedded tiny model on the built-in arithmetic task on CPU (no download, no GPU).
# Knobs: see examples/common.sh (e.g. STEPS=40 N=4 bash examples/cpu/remax.sh); extra args are Hydra overrides.
set -euo pipefail
ALGO=remax
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
run_rlplat "$@"
