#!/usr/bin/env bash
# GRPO on math with Qwen/Qwen3-30B-A3B, a mixture of experts (48 layers of 128 experts, top-8: 30.5B parameters, 3.3B
#   active per token): Megatron-Core training (tensor parallel 2 with sequence parallelism x expert parallel 8, bf16
#   weights with fp32 masters, the distributed optimizer sharing each expert's state over the two ranks that hold it,
#   recomputed activations) + vLLM rollout (tensor parallel 4); the update replays the log-prob pass's routing (r2).
#   Hardware: 2 nodes x 8 x 80 GB GPU in one Ray cluster (head: ray start --head --port=6379; the other node:
#   ray start --address=<head-ip>:6379; then this script on the head node), OUTPUT_DIR and the data on a filesystem
#   both nodes see. Install: pip install -e '.[vllm,megatron]'.
# Data first: as qwen2.5-7b_math_fsdp_hf.sh (data/math, and MATH-500 for validation).
# r3 (every training forward replays the rollout's routing) needs the routing from vLLM, which rlplat does not take
#   yet (docs/moe.md): ROUTER_REPLAY=r3 is refused at start-up with this engine.
# Expected: not yet run on a GPU with rlplat; the Megatron engine's experts (EP, the distributed optimizer, replay)
#   are tested on CPU against FSDP (docs/moe.md). Check it first: python -m rlplat.tools.plan (every phase fits 80 GB).
set -euo pipefail
ALGO=${ALGO:-grpo}
ACTOR=${ACTOR:-megatron}
ROLLOUT=${ROLLOUT:-vllm}
MODEL=${MODEL:-Qwen/Qwen3-30B-A3B}
DATA_DIR=${DATA_DIR:-data/math}
TRAIN_FILES=${TRAIN_FILES:-$DATA_DIR/train.parquet}
VAL_FILES=${VAL_FILES:-data/math500/test.parquet}
DEVICE=${DEVICE:-cuda}
NNODES=${NNODES:-2}
WORKERS=${WORKERS:-8}
RAY_ADDRESS=${RAY_ADDRESS:-auto}   # the cluster this node joined with `ray start`
TP=${TP:-2}
EP=${EP:-8}
PARAMS_DTYPE=${PARAMS_DTYPE:-bf16}
RECOMPUTE=${RECOMPUTE:-true}
ROUTER_REPLAY=${ROUTER_REPLAY:-r2}
ROLLOUT_TP=${ROLLOUT_TP:-4}
ROLLOUT_MEM=${ROLLOUT_MEM:-0.35}   # vLLM beside the training state (plan: ~26 GiB of 80 GB)
N=${N:-8}
VAL_N=${VAL_N:-1}
MAX_PROMPT_LEN=${MAX_PROMPT_LEN:-1024}
TRUNCATION=${TRUNCATION:-filter}
MAX_RESPONSE_LEN=${MAX_RESPONSE_LEN:-3072}
TRAIN_BATCH_PROMPTS=${TRAIN_BATCH_PROMPTS:-256}
MINI_BATCH_PROMPTS=${MINI_BATCH_PROMPTS:-32}
MICRO_BATCH_SEQS=${MICRO_BATCH_SEQS:-2}
LOG_PROB_MICRO_BATCH_SEQS=${LOG_PROB_MICRO_BATCH_SEQS:-2}
VAL_BATCH_PROMPTS=${VAL_BATCH_PROMPTS:-500}
LR=${LR:-1e-6}
STEPS=${STEPS:-150}
TEST_FREQ=${TEST_FREQ:-10}
SAVE_FREQ=${SAVE_FREQ:-50}
EXPERIMENT=${EXPERIMENT:-qwen3-30b-a3b_math_megatron_vllm}

source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
run_rlplat "$@"
