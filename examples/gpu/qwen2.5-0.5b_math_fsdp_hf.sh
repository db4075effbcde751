#!/usr/bin/env bash
# GRPO on math with Qwen/Qwen2.5-0.5B-Instruct: FSDP2 training + Hugging Face rollout. Hardware: 1 x 80 GB GPU.
# Data first: .venv/bin/python examples/data_preprocess/math_dataset.py --out-dir data/math   (writes train/test parquet)
#   and .venv/bin/python examples/data_preprocess/math_dataset.py --dataset HuggingFaceH4/MATH-500 --hub-splits test test --out-dir data/math500
#   (validation on MATH-500, as is usual for MATH: one call instead of 20 for the 5,000 test problems)
# Knobs: see examples/common.sh (e.g. LR=2e-6 N=16 bash examples/gpu/qwen2.5-0.5b_math_fsdp_hf.sh); extra args are Hydra overrides.
# Expected: MATH-500 accuracy (greedy) ~0.3 -> ~0.35; not yet run on a GPU with rlplat (the figures are the published
#   results of this model, data and algorithm in other frameworks). Check it first: python -m rlplat.tools.plan.
set -euo pipefail
ALGO=${ALGO:-grpo}
MODEL=${MODEL:-Qwen/Qwen2.5-0.5B-Instruct}
DATA_DIR=${DATA_DIR:-data/math}
TRAIN_FILES=${TRAIN_FILES:-$DATA_DIR/train.parquet}
VAL_FILES=${VAL_FILES:-data/math500/test.parquet}
DEVICE=${DEVICE:-cuda}
WORKERS=${WORKERS:-1}
N=${N:-8}
VAL_N=${VAL_N:-1}
MAX_PROMPT_LEN=${MAX_PROMPT_LEN:-1024}
TRUNCATION=${TRUNCATION:-filter}   # drop the few longer prompts (verl: filter_overlong_prompts)
MAX_RESPONSE_LEN=${MAX_RESPONSE_LEN:-1024}
TRAIN_BATCH_PROMPTS=${TRAIN_BATCH_PROMPTS:-128}
MINI_BATCH_PROMPTS=${MINI_BATCH_PROMPTS:-32}
MICRO_BATCH_SEQS=${MICRO_BATCH_SEQS:-16}
VAL_BATCH_PROMPTS=${VAL_BATCH_PROMPTS:-500}   # MATH-500 in one call
LOG_PROB_MICRO_BATCH_SEQS=${LOG_PROB_MICRO_BATCH_SEQS:-16}
LR=${LR:-1e-6}
STEPS=${STEPS:-200}
TEST_FREQ=${TEST_FREQ:-10}
SAVE_FREQ=${SAVE_FREQ:-50}
EXPERIMENT=${EXPERIMENT:-qwen2.5-0.5b_math_fsdp_hf}
RAY_ADDRESS=${RAY_ADDRESS-inprocess}   # one GPU: no Ray needed (RAY_ADDRESS= : a local Ray cluster)
source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
run_rlplat "$@"
