#!/usr/bin/env bash
# GRPO on gsm8k with Qwen/Qwen2.5-7B-Instruct and LoRA (docs/lora.md): FSDP2 trains rank-32 adapters on every
# linear layer of the decoder (the 7.6B base weights frozen, no gradients or optimizer state for them, no
# reference copy), vLLM samples with the merged weights (append rollout.lora_sync=adapter to send the adapters
# alone and let vLLM's LoRA layers apply them). Hardware: 4 x 80 GB GPU (the full run needs 8).
# LR 1e-5: about 10x the full run's, as "LoRA Without Regret" (Schulman et al., Thinking Machines 2025) finds.
# The run of qwen2.5-7b_gsm8k_fsdp_hf.sh (its knobs and data); install: pip install -e '.[vllm]'.
# Not yet run on a GPU. Check it first: python -m rlplat.tools.plan with the command this script prints.
set -euo pipefail
ACTOR=${ACTOR:-fsdp} ROLLOUT=${ROLLOUT:-vllm} TP=${TP:-1} WORKERS=${WORKERS:-4} LORA_RANK=${LORA_RANK:-32} \
    LR=${LR:-1e-5} EXPERIMENT=${EXPERIMENT:-qwen2.5-7b_gsm8k_lora_vllm} \
    exec bash "$(dirname "${BASH_SOURCE[0]}")/qwen2.5-7b_gsm8k_fsdp_hf.sh" "model.lora.alpha=$((2 * ${LORA_RANK:-32}))" "$@"
