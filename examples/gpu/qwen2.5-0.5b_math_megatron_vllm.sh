#!/usr/bin/env bash
# GRPO on math with Qwen/Qwen2.5-0.5B-Instruct: Megatron-Core training (tensor parallel 1, recomputed activations: Megatron-Core's
#   local attention keeps [heads, T, T] scores per layer, ~110 GB at 1.5k tokens without it) + vLLM rollout. Hardware: 1 x 80 GB GPU.
# The run of qwen2.5-0.5b_math_fsdp_hf.sh (its knobs and data) with other engines; install: pip install -e '.[vllm,megatron]'.
set -euo pipefail
ACTOR=${ACTOR:-megatron} ROLLOUT=${ROLLOUT:-vllm} TP=${TP:-1} RECOMPUTE=${RECOMPUTE:-true} EXPERIMENT=${EXPERIMENT:-qwen2.5-0.5b_math_megatron_vllm} \
    exec bash "$(dirname "${BASH_SOURCE[0]}")/qwen2.5-0.5b_math_fsdp_hf.sh" "$@"
