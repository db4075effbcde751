#!/usr/bin/env bash
# GRPO on Geometry3K with Qwen/Qwen2.5-VL-7B-Instruct (images in the prompts): FSDP2 training + Hugging Face rollout,
#   the vision tower frozen (actor.vision.freeze=true, docs/vision.md). Hardware: 8 x 80 GB GPU.
# Data first: .venv/bin/python examples/data_preprocess/geo3k.py --out-dir data/geo3k   (writes train/test parquet)
# Knobs: see examples/common.sh (e.g. IMAGE_MAX_PIXELS=401408 LR=2e-6 bash examples/gpu/qwen2.5-vl-7b_geo3k_fsdp_hf.sh);
#   extra args are Hydra overrides.
# Expected: Geometry3K test accuracy (greedy) rising over the run; not yet run on a GPU with rlplat, and no published
#   figure for these settings is quoted here. Check it first: python -m rlplat.tools.plan.
set -euo pipefail
ALGO=${ALGO:-grpo}
MODEL=${MODEL:-Qwen/Qwen2.5-VL-7B-Instruct}
DATA_DIR=${DATA_DIR:-data/geo3k}
TRAIN_FILES=${TRAIN_FILES:-$DATA_DIR/train.parquet}
VAL_FILES=${VAL_FILES:-$DATA_DIR/test.parquet}
DEVICE=${DEVICE:-cuda}
WORKERS=${WORKERS:-8}
N=${N:-5}
VAL_N=${VAL_N:-1}
MAX_PROMPT_LEN=${MAX_PROMPT_LEN:-1024}   # the image's tokens included (at most IMAGE_MAX_PIXELS / 28^2 of them)
TRUNCATION=${TRUNCATION:-filter}
IMAGE_MAX_PIXELS=${IMAGE_MAX_PIXELS:-602112}   # 768 image tokens at most (geo3k's figures are far smaller)
MAX_RESPONSE_LEN=${MAX_RESPONSE_LEN:-2048}
TRAIN_BATCH_PROMPTS=${TRAIN_BATCH_PROMPTS:-512}
MINI_BATCH_PROMPTS=${MINI_BATCH_PROMPTS:-128}
MICRO_BATCH_SEQS=${MICRO_BATCH_SEQS:-8}
GRAD_CKPT=${GRAD_CKPT:-true}
ROLLOUT_BATCH_SEQS=${ROLLOUT_BATCH_SEQS:-128}
VAL_BATCH_PROMPTS=${VAL_BATCH_PROMPTS:-601}   # geo3k's test split in one call
LOG_PROB_MICRO_BATCH_SEQS=${LOG_PROB_MICRO_BATCH_SEQS:-16}
LR=${LR:-1e-6}
STEPS=${STEPS:-15}   # 2,101 prompts / 512 per step: ~4 epochs
TEST_FREQ=${TEST_FREQ:-5}
SAVE_FREQ=${SAVE_FREQ:-5}
EXPERIMENT=${EXPERIMENT:-qwen2.5-vl-7b_geo3k_fsdp_hf}

source "$(dirname "${BASH_SOURCE[0]}")/../common.sh"
run_rlplat "$@"
