# Shared knobs of the example scripts; each script sets its own defaults, then sources this file and calls
# `run_rlplat "$@"`. Every knob is an environment variable (VAR=value bash examples/cpu/grpo.sh), and every
# argument is passed through as a Hydra override (bash examples/cpu/grpo.sh rollout.top_p=0.9).
# A knob left unset keeps rlplat's own default (the embedded CPU quickstart), so the CPU scripts differ
# only in their preset.

EXAMPLES_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$EXAMPLES_DIR")"

ALGO=${ALGO:-grpo}                       # algorithm preset (rlplat/config/algorithm/*.yaml)
ACTOR=${ACTOR:-fsdp}                     # training engine preset: fsdp | megatron
ROLLOUT=${ROLLOUT:-hf}                   # rollout engine preset: hf | vllm | sglang
TP=${TP:-1}                              # megatron: workers one model replica is split over
PP=${PP:-1}                              # megatron: pipeline stages (each holds layers / PP)
SP=${SP:-$([ "$TP" -gt 1 ] && echo true || echo false)}  # megatron: sequence parallelism (default: on when TP > 1)
MODEL=${MODEL:-embedded}                 # HF hub id or local directory; embedded = the tiny CPU model
TRAIN_FILES=${TRAIN_FILES:-builtin:arithmetic}   # parquet file(s): one path or [a.parquet,b.parquet]
VAL_FILES=${VAL_FILES:-builtin:arithmetic}
N=${N:-8}                                # responses per prompt (rollout.n)
VAL_N=${VAL_N:-4}                        # responses per validation prompt
MAX_PROMPT_LEN=${MAX_PROMPT_LEN:-512}    # tokens
MAX_RESPONSE_LEN=${MAX_RESPONSE_LEN:-8}  # tokens
TRAIN_BATCH_PROMPTS=${TRAIN_BATCH_PROMPTS:-64}   # prompts per step (global)
MINI_BATCH_PROMPTS=${MINI_BATCH_PROMPTS:-16}     # prompts per optimizer step (global)
MICRO_BATCH_SEQS=${MICRO_BATCH_SEQS:-128}        # sequences per forward/backward per worker
LOG_PROB_MICRO_BATCH_SEQS=${LOG_PROB_MICRO_BATCH_SEQS:-128}
LR=${LR:-3e-4}                           # actor peak learning rate (~1e-6 for real LLMs)
STEPS=${STEPS:-450}                      # training steps
TEST_FREQ=${TEST_FREQ:-50}               # validate every N steps (<= 0: only before and after)
SAVE_FREQ=${SAVE_FREQ:-0}                # checkpoint every N steps (<= 0: only at the end)
WORKERS=${WORKERS:-1}                    # workers (devices) per node
NNODES=${NNODES:-1}                      # Ray nodes
DEVICE=${DEVICE:-auto}                   # auto | cpu | cuda
LOGGER=${LOGGER:-console,jsonl}          # comma list: console, jsonl, tensorboard, wandb
EXPERIMENT=${EXPERIMENT:-$ALGO}
OUTPUT_DIR=${OUTPUT_DIR:-outputs/$EXPERIMENT}
RAY_ADDRESS=${RAY_ADDRESS:-}             # empty = a local Ray cluster; inprocess = no Ray; auto / host:port = join
if [ -z "${PYTHON:-}" ]; then            # the checkout's venv (scripts/setup.sh) when there is one
    if [ -x "$REPO_DIR/.venv/bin/python" ]; then PYTHON="$REPO_DIR/.venv/bin/python"; else PYTHON=python; fi
fi

run_rlplat() {
    local ray=()
    if [ -n "$RAY_ADDRESS" ]; then ray=("trainer.ray_address=$RAY_ADDRESS"); fi
    set -x
    "$PYTHON" -m rlplat.trainer.main \
        "algorithm=$ALGO" \
        "actor=$ACTOR" \
        "rollout=$ROLLOUT" \
        "actor.megatron.tensor_model_parallel_size=$TP" \
        "actor.megatron.pipeline_model_parallel_size=$PP" \
        "actor.megatron.sequence_parallel=$SP" \
        "model.path=$MODEL" \
        "data.train_files=$TRAIN_FILES" \
        "data.val_files=$VAL_FILES" \
        "data.max_prompt_length=$MAX_PROMPT_LEN" \
        "data.max_response_length=$MAX_RESPONSE_LEN" \
        "data.train_batch_size_prompts=$TRAIN_BATCH_PROMPTS" \
        "actor.mini_batch_size_prompts=$MINI_BATCH_PROMPTS" \
        "actor.micro_batch_size_seqs_per_worker=$MICRO_BATCH_SEQS" \
        "actor.log_prob_micro_batch_size_seqs_per_worker=$LOG_PROB_MICRO_BATCH_SEQS" \
        "critic.micro_batch_size_seqs_per_worker=$MICRO_BATCH_SEQS" \
        "ref.log_prob_micro_batch_size_seqs_per_worker=$LOG_PROB_MICRO_BATCH_SEQS" \
        "actor.optim.lr=$LR" \
        "rollout.n=$N" \
        "rollout.val_n=$VAL_N" \
        "trainer.total_steps=$STEPS" \
        "trainer.test_freq=$TEST_FREQ" \
        "trainer.save_freq=$SAVE_FREQ" \
        "trainer.workers_per_node=$WORKERS" \
        "trainer.nnodes=$NNODES" \
        "trainer.device=$DEVICE" \
        "trainer.logger=[$LOGGER]" \
        "trainer.experiment_name=$EXPERIMENT" \
        "trainer.output_dir=$OUTPUT_DIR" \
        "${ray[@]}" \
        "$@"
}
