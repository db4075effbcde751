#!/usr/bin/env bash
# REINFORCE++ (2501.03262): discounted token returns whitened over the batch; KL in the reward.
# Trains the embedded tiny model on the built-in arithmetic task on CPU (no download, no GPU).
# Knobs: see examples/common.sh (e.g. STEPS=40 N=4 bash examples/cpu/reinforce_pp.sh); extra args are Hydra overrides.
set -euo pipefail
ALGO=reinforce_pp
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
run_rlplat "$@"
