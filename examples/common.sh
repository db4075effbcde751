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
MAX_PROMPT_LEN=${MAX_PROMPT_LEN:-512}    # tokens
MAX_RESPONSE_LEN=${MAX_RESPONSE_LEN:-8}  # tokens
TRAIN_BATCH_PROMPTS=${TRAIN_BATCH_PROMPTS:-64}   # prompts per step (global)
MINI_BATCH_PROMPTS=${MINI_BATCH_PROMPTS:-16}     # prompts per optimizer step (global)
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
# Knobs passed only when set (unset: rlplat's own default):
#   MICRO_BATCH_SEQS    actor.micro_batch_size_seqs_per_worker and critic.micro_batch_size_seqs_per_worker:
#                       sequences per forward/backward per worker (unset: the whole per-worker mini-batch, up to 128)
#   LOG_PROB_MICRO_BATCH_SEQS  actor. and ref.log_prob_micro_batch_size_seqs_per_worker (log-prob passes)
#   VAL_N               rollout.val_n: responses per validation prompt (> 1 with VAL_TEMPERATURE > 0)
#   TRUNCATION          data.truncation: error | left | right | filter (drop prompts over MAX_PROMPT_LEN)
#   VAL_BATCH_PROMPTS   data.val_batch_size_prompts: prompts per validation call
#   VAL_TEMPERATURE     rollout.val_temperature (0 = greedy)
#   GRAD_CKPT           model.gradient_checkpointing (FSDP): true = recompute activations in backward
#   MICRO_BATCH_TOKENS  actor.micro_batch_max_tokens_per_worker: a token budget per micro-batch
#   RECOMPUTE           actor.megatron.recompute_activations (Megatron)
#   REF_OFFLOAD         ref.fsdp.param_offload: the reference's weights in host memory
#   ROLLOUT_BATCH_SEQS  rollout.hf.batch_size_seqs_per_worker: sequences the HF engine samples at once
#   ROLLOUT_MEM         rollout.vllm.gpu_memory_utilization / rollout.sglang.mem_fraction_static
#   ROLLOUT_TP          rollout.vllm.tensor_parallel_size / rollout.sglang.tensor_parallel_size (GPUs per engine;
#                       TP is Megatron's training tensor parallelism)
#   ROLLOUT_MODE        rollout.mode: colocated | separate (rollout workers on a pool of their own, docs/async.md)
#   ROLLOUT_WORKERS     rollout.workers_per_node: rollout workers (devices) per node of the separate pool
#   ASYNC_STEPS         trainer.async_steps: steps the separate rollout pool generates ahead (0 = in turn)
#   STREAM_GROUPS       rollout.stream_groups: prompt groups per generation call of the separate pool (0 = whole batches)
#   PARTIAL             rollout.partial: finish | resume (load weight updates between two tokens; hf engine)
#   LORA_RANK           model.lora.rank: LoRA adapters of this rank on the actor (docs/lora.md; 0 = off)
#   ULYSSES             actor.fsdp.ulysses_size and ref.fsdp.ulysses_size: workers each sequence is split over
#                       (Ulysses sequence parallelism, FSDP; docs/long_context.md)
#   IMAGE_MAX_PIXELS    data.image_max_pixels: a vision-language model's largest image, in pixels (docs/vision.md)
if [ -z "${PYTHON:-}" ]; then            # the checkout's venv (scripts/setup.sh) when there is one
    if [ -x "$REPO_DIR/.venv/bin/python" ]; then PYTHON="$REPO_DIR/.venv/bin/python"; else PYTHON=python; fi
fi

# the override KEY=VALUE for each knob that is set: optional KNOB KEY [KEY ...]
optional() {
    local knob=$1 key
    shift
    if [ -n "${!knob:-}" ]; then for key in "$@"; do extra+=("$key=${!knob}"); done; fi
}

run_rlplat() {
    local ray=() extra=()
    if [ -n "$RAY_ADDRESS" ]; then ray=("trainer.ray_address=$RAY_ADDRESS"); fi
    if [ "$ACTOR" != megatron ] && { [ "$TP" != 1 ] || [ "$PP" != 1 ]; }; then
        echo "TP=$TP PP=$PP: Megatron's training parallel sizes, used with ACTOR=megatron only (ACTOR=$ACTOR);" \
             "the rollout engine's tensor parallelism is ROLLOUT_TP" >&2
        exit 2
    fi
    optional MICRO_BATCH_SEQS actor.micro_batch_size_seqs_per_worker critic.micro_batch_size_seqs_per_worker
    optional LOG_PROB_MICRO_BATCH_SEQS actor.log_prob_micro_batch_size_seqs_per_worker \
        ref.log_prob_micro_batch_size_seqs_per_worker
    optional TRUNCATION data.truncation
    optional VAL_BATCH_PROMPTS data.val_batch_size_prompts
    optional VAL_N rollout.val_n
    optional VAL_TEMPERATURE rollout.val_temperature
    optional GRAD_CKPT model.gradient_checkpointing
    optional MICRO_BATCH_TOKENS actor.micro_batch_max_tokens_per_worker
    optional RECOMPUTE actor.megatron.recompute_activations
    optional REF_OFFLOAD ref.fsdp.param_offload
    optional ROLLOUT_BATCH_SEQS rollout.hf.batch_size_seqs_per_worker
    optional ROLLOUT_MEM rollout.vllm.gpu_memory_utilization rollout.sglang.mem_fraction_static
    optional ROLLOUT_TP rollout.vllm.tensor_parallel_size rollout.sglang.tensor_parallel_size
    optional ROLLOUT_MODE rollout.mode
    optional ROLLOUT_WORKERS rollout.workers_per_node
    optional ASYNC_STEPS trainer.async_steps
    optional STREAM_GROUPS rollout.stream_groups
    optional PARTIAL rollout.partial
    optional LORA_RANK model.lora.rank
    optional ULYSSES actor.fsdp.ulysses_size ref.fsdp.ulysses_size
    optional IMAGE_MAX_PIXELS data.image_max_pixels
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
        "actor.optim.lr=$LR" \
        "rollout.n=$N" \
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
        "${extra[@]}" \
        "$@"
}
