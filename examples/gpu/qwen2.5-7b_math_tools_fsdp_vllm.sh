#!/usr/bin/env bash
# GRPO on math with a sandboxed Python tool (docs/agents.md), Qwen/Qwen2.5-7B-Instruct: FSDP2 training + vLLM
# rollout, multi-turn: the model may run Python (its chat template lists the tool; calls in the hermes
# <tool_call> format) before it answers within \boxed{}. Hardware: 8 x 80 GB GPU.
# The run of qwen2.5-7b_math_fsdp_hf.sh (its data, knobs and preprocessing) with the tool loop.
# Knobs: those of that script, plus MAX_TURNS and MAX_TOTAL_TOKENS (all turns and tool output; MAX_RESPONSE_LEN
# is one turn's budget) (e.g. MAX_TURNS=6 bash examples/gpu/qwen2.5-7b_math_tools_fsdp_vllm.sh).
# Expected: not yet run on a GPU with rlplat. Check the plan first: python -m rlplat.tools.plan.
set -euo pipefail
ROLLOUT=${ROLLOUT:-vllm} MAX_RESPONSE_LEN=${MAX_RESPONSE_LEN:-2048} EXPERIMENT=${EXPERIMENT:-qwen2.5-7b_math_tools_fsdp_vllm} \
    exec bash "$(dirname "${BASH_SOURCE[0]}")/qwen2.5-7b_math_fsdp_hf.sh" rollout.agent.name=tool \
    "rollout.agent.tools=[python]" rollout.agent.max_turns="${MAX_TURNS:-4}" \
    rollout.agent.max_total_tokens="${MAX_TOTAL_TOKENS:-4096}" "$@"
