#!/usr/bin/env bash
# GRPO with LoRA adapters (docs/lora.md): the embedded model's weights stay frozen and adapters of rank
# LORA_RANK (alpha = 2 x rank) on every linear layer of the decoder train instead; the KL's reference is the
# same model with its adapters off (no second copy). Adapters want a larger learning rate than full
# fine-tuning: LR=1e-3 here (3e-4 for the full run).
# Knobs: examples/common.sh (LORA_RANK among them); extra args are Hydra overrides, e.g.
#   LORA_RANK=8 bash examples/cpu/grpo_lora.sh rollout.lora_sync=adapter
set -euo pipefail
ALGO=grpo
EXPERIMENT=${EXPERIMENT:-grpo_lora}
LORA_RANK=${LORA_RANK:-16}
LR=${LR:-1e-3}
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
run_rlplat "model.lora.alpha=$((2 * LORA_RANK))" "$@"
