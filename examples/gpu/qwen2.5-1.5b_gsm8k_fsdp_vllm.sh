#!/usr/bin/env bash
# GRPO on gsm8k with Qwen/Qwen2.5-1.5B-Instruct: FSDP2 training + vLLM rollout. Hardware: 4 x 80 GB GPU.
# The run of qwen2.5-1.5b_gsm8k_fsdp_hf.sh (its knobs and data) with other engines; install: pip install -e '.[vllm]'.
set -euo pipefail
ACTOR=${ACTOR:-fsdp} ROLLOUT=${ROLLOUT:-vllm} TP=${TP:-1} EXPERIMENT=${EXPERIMENT:-qwen2.5-1.5b_gsm8k_fsdp_vllm} \
    exec bash "$(dirname "${BASH_SOURCE[0]}")/qwen2.5-1.5b_gsm8k_fsdp_hf.sh" "$@"
