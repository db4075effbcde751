#!/usr/bin/env bash
# PPO (1707.06347) with a critic and GAE (1506.02438); KL to the reference in the reward.
# Trains the embedded tiny model on the built-in arithmetic task on CPU (no download, no GPU).
# Knobs: see examples/common.sh (e.g. STEPS=40 N=4 bash examples/cpu/ppo.sh); extra args are Hydra overrides.
set -euo pipefail
ALGO=ppo
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
run_rlplat "$@"
