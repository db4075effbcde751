#!/usr/bin/env bash
# On-policy distillation on math (docs/distillation.md): Qwen/Qwen2.5-7B-Instruct teaches Qwen/Qwen2.5-1.5B-Instruct
# (one tokenizer), each sampled token's advantage -(log pi_student - log pi_teacher). FSDP2 training with the teacher
# colocated (its weights sharded over the same GPUs) + vLLM rollout. Hardware: 4 x 80 GB GPU.
# The run of qwen2.5-1.5b_math_fsdp_hf.sh (its data and knobs) with ALGO=opd; install: pip install -e '.[vllm]'.
# GRPO plus distillation: ALGO=grpo bash examples/gpu/qwen2.5-1.5b_math_opd_fsdp_vllm.sh algorithm.distill.coef=0.5
# Not yet run on a GPU with rlplat; check it first: python -m rlplat.tools.plan (the teacher's memory is counted).
set -euo pipefail
ALGO=${ALGO:-opd} TEACHER=${TEACHER:-Qwen/Qwen2.5-7B-Instruct} N=${N:-4} ACTOR=${ACTOR:-fsdp} ROLLOUT=${ROLLOUT:-vllm} \
    TP=${TP:-1} EXPERIMENT=${EXPERIMENT:-qwen2.5-1.5b_math_opd_fsdp_vllm} \
    exec bash "$(dirname "${BASH_SOURCE[0]}")/qwen2.5-1.5b_math_fsdp_hf.sh" "$@"
