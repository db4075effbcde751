#!/usr/bin/env bash
# GRPO with a calculator tool (docs/agents.md): multi-turn rollouts where the model may call the tool
# before it answers, trained on the whole trajectory (the tool's output attended to, not trained).
# The model is the embedded tool model (model.path=embedded-tools: the embedded model fine-tuned on
# builtin:tool_arithmetic prompts, half of them showing the tool in use, built on first use in ~2 min);
# the task asks for products of two 3-digit numbers, which it cannot compute without the tool.
# Knobs: examples/common.sh, plus MAX_TURNS (assistant turns per trajectory), MAX_TOTAL_TOKENS (all turns and
# tool results together; MAX_RESPONSE_LEN is one turn's budget). Extra args are Hydra overrides.
set -euo pipefail
ALGO=grpo
EXPERIMENT=${EXPERIMENT:-grpo_tools}
MODEL=${MODEL:-embedded-tools}
TRAIN_FILES=${TRAIN_FILES:-builtin:tool_arithmetic}
VAL_FILES=${VAL_FILES:-builtin:tool_arithmetic}
MAX_RESPONSE_LEN=${MAX_RESPONSE_LEN:-88}
TRAIN_BATCH_PROMPTS=${TRAIN_BATCH_PROMPTS:-32}
MINI_BATCH_PROMPTS=${MINI_BATCH_PROMPTS:-8}
STEPS=${STEPS:-30}
TEST_FREQ=${TEST_FREQ:-10}
VAL_TEMPERATURE=${VAL_TEMPERATURE:-1.0}
VAL_N=${VAL_N:-2}
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
run_rlplat rollout.agent.name=tool rollout.agent.max_turns="${MAX_TURNS:-3}" \
    rollout.agent.max_total_tokens="${MAX_TOTAL_TOKENS:-128}" "$@"
