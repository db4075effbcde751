#!/usr/bin/env bash
# GRPO on gsm8k with Qwen/Qwen2.5-0.5B-Instruct, asynchronous (docs/async.md): FSDP2 training on one GPU while
# vLLM on a second generates the next batch (rollout.mode=separate, trainer.async_steps=1; the stale samples weighted
# by truncated importance sampling, algorithm.off_policy.correction=tis). Hardware: 2 x 80 GB GPU.
# The run of qwen2.5-0.5b_gsm8k_fsdp_hf.sh (its knobs and data) on two pools; install: pip install -e '.[vllm]'.
# Knobs: also ROLLOUT_WORKERS (GPUs of the rollout pool) and ASYNC_STEPS, steps generated ahead
#   (e.g. ASYNC_STEPS=2 bash examples/gpu/qwen2.5-0.5b_gsm8k_async_fsdp_vllm.sh). Not yet run on a GPU.
set -euo pipefail
ROLLOUT=${ROLLOUT:-vllm} ROLLOUT_MODE=${ROLLOUT_MODE:-separate} ROLLOUT_WORKERS=${ROLLOUT_WORKERS:-1} \
ASYNC_STEPS=${ASYNC_STEPS:-1} ROLLOUT_MEM=${ROLLOUT_MEM:-0.85} RAY_ADDRESS=${RAY_ADDRESS-} \
EXPERIMENT=${EXPERIMENT:-qwen2.5-0.5b_gsm8k_async_fsdp_vllm} \
    exec bash "$(dirname "${BASH_SOURCE[0]}")/qwen2.5-0.5b_gsm8k_fsdp_hf.sh" algorithm.off_policy.correction=tis "$@"
