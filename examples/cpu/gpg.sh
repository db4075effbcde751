#!/usr/bin/env bash
# GPG (2504.02546): plain policy gradient with a corrected group baseline, no clipping, no KL.
# Trains the embedded tiny model on the built-in arithmetic task on CPU (no download, no GPU).
# Knobs: see examples/common.sh (e.g. STEPS=40 N=4 bash examples/cpu/gpg.sh); extra args are Hydra overrides.
set -euo pipefail
ALGO=gpg
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
run_rlplat "$@"
