#!/usr/bin/env bash
# GRPO (DeepSeekMath, 2402.03300): group-normalised outcome advantage, PPO clip, per-sequence token
# Trains the embedded tiny model on the built-in arithmetic task on CPU (no download, no GPU).
# Knobs: see examples/common.sh (e.g. STEPS=40 N=4 bash examples/cpu/grpo.sh); extra args are Hydra overrides.
set -euo pipefail
ALGO=grpo
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
run_rlplat "$@"
