#!/usr/bin/env bash
# DPPO-Binary-TV (2602.04879): a token keeps its gradient while its probability moved by at most a threshold.
# Trains the embedded tiny model on the built-in arithmetic task on CPU (no download, no GPU).
# Knobs: see examples/common.sh (e.g. STEPS=40 N=4 bash examples/cpu/dppo_tv.sh); extra args are Hydra overrides.
set -euo pipefail
ALGO=dppo_tv
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
run_rlplat "$@"
