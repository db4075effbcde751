#!/usr/bin/env bash
# GRPO on gsm8k with Qwen/Qwen2.5-1.5B-Instruct: FSDP2 training + SGLang rollout. Hardware: 4 x 80 GB GPU.
# SGLang: written against its documented API, never run yet (it needs CUDA; no GPU run has included it): docs/rollout.md.
# The run of qwen2.5-1.5b_gsm8k_fsdp_hf.sh (its knobs and data) with other engines; install: pip install -e '.[sglang]'.
set -euo pipefail
ACTOR=${ACTOR:-fsdp} ROLLOUT=${ROLLOUT:-sglang} TP=${TP:-1} EXPERIMENT=${EXPERIMENT:-qwen2.5-1.5b_gsm8k_fsdp_sglang} \
    exec bash "$(dirname "${BASH_SOURCE[0]}")/qwen2.5-1.5b_gsm8k_fsdp_hf.sh" "$@"
