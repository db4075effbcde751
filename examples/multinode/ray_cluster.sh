#!/usr/bin/env bash
# Multi-node GRPO: joins a running Ray cluster and places trainer.workers_per_node workers on each of
# trainer.nnodes nodes. Default: Qwen2.5-7B-Instruct on GSM8K, 2 nodes x 8 GPUs.
#   head node:    ray start --head --port=6379
#   other nodes:  ray start --address=<head-ip>:6379
#   head node:    NNODES=2 WORKERS=8 bash examples/multinode/ray_cluster.sh
# OUTPUT_DIR (checkpoints, exports) and the data files must be on a filesystem every node sees.
# Knobs: see examples/common.sh; extra args are Hydra overrides.
set -euo pipefail
RAY_ADDRESS=${RAY_ADDRESS:-auto}        # auto = the cluster this node joined with `ray start`
NNODES=${NNODES:-2}
WORKERS=${WORKERS:-8}
ALGO=${ALGO:-grpo}
MODEL=${MODEL:-Qwen/Qwen2.5-7B-Instruct}
DATA_DIR=${DATA_DIR:-data/gsm8k}
TRAIN_FILES=${TRAIN_FILES:-$DATA_DIR/train.parquet}
VAL_FILES=${VAL_FILES:-$DATA_DIR/test.parquet}
DEVICE=${DEVICE:-cuda}
VAL_N=${VAL_N:-1}
MAX_PROMPT_LEN=${MAX_PROMPT_LEN:-512}
MAX_RESPONSE_LEN=${MAX_RESPONSE_LEN:-1024}
TRAIN_BATCH_PROMPTS=${TRAIN_BATCH_PROMPTS:-512}
MINI_BATCH_PROMPTS=${MINI_BATCH_PROMPTS:-64}
MICRO_BATCH_SEQS=${MICRO_BATCH_SEQS:-4}
LOG_PROB_MICRO_BATCH_SEQS=${LOG_PROB_MICRO_BATCH_SEQS:-4}
LR=${LR:-1e-6}
STEPS=${STEPS:-100}
TEST_FREQ=${TEST_FREQ:-10}
SAVE_FREQ=${SAVE_FREQ:-25}
EXPERIMENT=${EXPERIMENT:-multinode_grpo}
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
run_rlplat "$@"
