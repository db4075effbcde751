#!/usr/bin/env bash
# GRPO on math with Qwen/Qwen2.5-7B-Instruct and responses of up to 16k tokens: FSDP2 with Ulysses sequence
# parallelism (docs/long_context.md): each sequence split over ULYSSES=4 GPUs, which attend over all of it for
# 7 of the 28 heads each (2 replicas on 8 GPUs), + vLLM rollout (generation is not split: a 17k-token sequence
# must fit one vLLM engine's KV cache). Hardware: 8 x 80 GB GPU.
# The run of qwen2.5-7b_math_fsdp_hf.sh (its knobs and data) with longer responses; install: pip install -e '.[vllm]'.
# Not yet run on a GPU. Check it first: python -m rlplat.tools.plan with the command this script prints.
set -euo pipefail
ACTOR=${ACTOR:-fsdp} ROLLOUT=${ROLLOUT:-vllm} TP=${TP:-1} ULYSSES=${ULYSSES:-4} \
    MAX_RESPONSE_LEN=${MAX_RESPONSE_LEN:-16384} MICRO_BATCH_SEQS=${MICRO_BATCH_SEQS:-1} \
    LOG_PROB_MICRO_BATCH_SEQS=${LOG_PROB_MICRO_BATCH_SEQS:-2} EXPERIMENT=${EXPERIMENT:-qwen2.5-7b_math_ulysses_vllm} \
    exec bash "$(dirname "${BASH_SOURCE[0]}")/qwen2.5-7b_math_fsdp_hf.sh" "$@"
