#!/usr/bin/env bash
# GSPO (2507.18071): sequence-level importance ratio with tiny clip ranges, sequence-mean loss.
# Trains the embedded tiny model on the built-in arithmetic task on CPU (no download, no GPU).
# Knobs: see examples/common.sh (e.g. STEPS=40 N=4 bash examples/cpu/gspo.sh); extra args are Hydra overrides.
set -euo pipefail
ALGO=gspo
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
run_rlplat "$@"
