#!/usr/bin/env bash
# GRPO on math with Qwen/Qwen2.5-7B-Instruct: Megatron-Core training (tensor parallel 2 x pipeline parallel 2, recomputed activations, as verl's
#   7B Megatron runs) + vLLM rollout. Hardware: 8 x 80 GB GPU.
# The run of qwen2.5-7b_math_fsdp_hf.sh (its knobs and data) with other engines; install: pip install -e '.[vllm,megatron]'.
set -euo pipefail
ACTOR=${ACTOR:-megatron} ROLLOUT=${ROLLOUT:-vllm} TP=${TP:-2} PP=${PP:-2} RECOMPUTE=${RECOMPUTE:-true} EXPERIMENT=${EXPERIMENT:-qwen2.5-7b_math_megatron_vllm} \
    exec bash "$(dirname "${BASH_SOURCE[0]}")/qwen2.5-7b_math_fsdp_hf.sh" "$@"
