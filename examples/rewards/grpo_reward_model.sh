#!/usr/bin/env bash
# GRPO with a learned reward model as the only reward (reward.model.path; docs/rewards.md "Reward models").
# Without RM_PATH it first builds a tiny reward model on CPU (~5 s) that scores arithmetic answers containing
# a 7 high, then trains the embedded model with it: after 20 steps about 3 in 4 sampled answers contain a 7
# (1 in 5 before). RM_PATH=/path/to/model uses your own Hugging Face sequence-classification reward model
# (one output, num_labels=1).
# Knobs: examples/common.sh, plus RM_PATH, RM_PLACEMENT (colocated | separate: a pool of its own, under Ray),
# RM_NORMALIZE (none | batch: standardised over each batch). Extra args are Hydra overrides.
set -euo pipefail
ALGO=grpo
EXPERIMENT=${EXPERIMENT:-grpo_reward_model}
STEPS=${STEPS:-20}
TRAIN_BATCH_PROMPTS=${TRAIN_BATCH_PROMPTS:-16}
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
if [ -z "${RM_PATH:-}" ]; then
    RM_PATH="$OUTPUT_DIR/tiny-reward-model"
    if [ ! -f "$RM_PATH/config.json" ]; then
        "$PYTHON" -c "import sys; from rlplat.models.tiny import build_tiny_reward_model as build
print(f'[example] a tiny reward model that prefers a 7: {sys.argv[1]} (accuracy {build(sys.argv[1]):.3f})')" "$RM_PATH"
    fi
fi
run_rlplat reward.model.path="$RM_PATH" reward.model.placement="${RM_PLACEMENT:-colocated}" \
    reward.model.normalize="${RM_NORMALIZE:-none}" "$@"
