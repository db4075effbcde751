#!/usr/bin/env bash
# GRPO on math with Qwen/Qwen2.5-0.5B-Instruct: FSDP2 training + Hugging Face rollout. Hardware: 1 x 80 GB GPU.
# Data first: .venv/bin/python examples/data_preprocess/math_dataset.py --out-dir data/math   (writes train/test parquet)
# Knobs: see examples/common.sh (e.g. WORKERS=4 LR=2e-6 bash examples/gpu/qwen2.5-0.5b_math_fsdp_hf.sh); extra args are Hydra overrides.
set -euo pipefail
ALGO=${ALGO:-grpo}
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
DATA_DIR=${DATA_DIR:-data/math}
TRAIN_FILES=${TRAIN_FILES:-$DATA_DIR/train.parquet}
VAL_FILES=${VAL_FILES:-$DATA_DIR/test.parquet}
DEVICE=${DEVICE:-cuda}
WORKERS=${WORKERS:-1}
N=${N:-8}
VAL_N=${VAL_N:-1}
MAX_PROMPT_LEN=${MAX_PROMPT_LEN:-512}
MAX_RESPONSE_LEN=${MAX_RESPONSE_LEN:-1024}
TRAIN_BATCH_PROMPTS=${TRAIN_BATCH_PROMPTS:-128}
MINI_BATCH_PROMPTS=${MINI_BATCH_PROMPTS:-32}
MICRO_BATCH_SEQS=${MICRO_BATCH_SEQS:-16}
LOG_PROB_MICRO_BATCH_SEQS=${LOG_PROB_MICRO_BATCH_SEQS:-16}
LR=${LR:-1e-6}
STEPS=${STEPS:-200}
TEST_FREQ=${TEST_FREQ:-10}
SAVE_FREQ=${SAVE_FREQ:-50}
EXPERIMENT=${EXPERIMENT:-qwen2.5-0.5b_math_fsdp_hf}
RAY_ADDRESS=${RAY_ADDRESS-inprocess}   # one GPU: no Ray needed (RAY_ADDRESS= : a local Ray cluster)
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
run_rlplat "$@"
