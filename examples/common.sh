# Shared knobs of the example scripts; each script sets its own defaults, then sources this file and calls
# `run_rlplat "$@"`. Every knob is an environment variable (VAR=value bash examples/cpu/grpo.sh), and every
# argument is passed through as a Hydra override (bash examples/cpu/grpo.sh rollout.top_p=0.9).
# A knob left unset keeps rlplat's own default (the embedded CPU quickstart), so the CPU scripts differ
# only in their preset.

EXAMPLES_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_DIR="$(dirname "$EXAMPLES_DIR")"

# verl's launch variables (the names its example scripts read) are read as these knobs, unless the knob itself is set
# in the environment (a script's own default is not): MODEL_PATH=Qwen/Qwen3-8B ROLLOUT_N=4 bash examples/gpu/....sh
VERL_NAMES=(
    MODEL=MODEL_PATH MODEL=HF_MODEL_PATH TRAIN_FILES=TRAIN_FILE VAL_FILES=TEST_FILE VAL_FILES=TEST_FILES
    VAL_FILES=VAL_FILE ROLLOUT=INFER_BACKEND N=ROLLOUT_N TRAIN_BATCH_PROMPTS=TRAIN_BATCH_SIZE
    MINI_BATCH_PROMPTS=PPO_MINI_BATCH_SIZE MICRO_BATCH_SEQS=PPO_MICRO_BATCH_SIZE_PER_GPU
    LOG_PROB_MICRO_BATCH_SEQS=LOG_PROB_MICRO_BATCH_SIZE_PER_GPU MICRO_BATCH_TOKENS=PPO_MAX_TOKEN_LEN_PER_GPU
    MAX_PROMPT_LEN=MAX_PROMPT_LENGTH MAX_RESPONSE_LEN=MAX_RESPONSE_LENGTH LR=ACTOR_LR STEPS=TOTAL_TRAINING_STEPS
    WORKERS=NGPUS_PER_NODE WORKERS=N_GPUS_PER_NODE WORKERS=NDEVICES_PER_NODE
    EXPERIMENT=EXPERIMENT_NAME ROLLOUT_TP=GEN_TP ROLLOUT_MEM=ROLLOUT_GPU_MEM_UTIL ULYSSES=SP_SIZE TP=ACTOR_TP
    TP=TRAIN_TP PP=ACTOR_PP EP=ACTOR_EP
)
# verl's variables these scripts have no knob for: set, each is reported in one line instead of silently ignored
VERL_OTHERS=(PROJECT_NAME CKPTS_DIR TOTAL_EPOCHS ENTROPY_COEFF KL_LOSS_COEF CLIP_RATIO_LOW CLIP_RATIO_HIGH
    ACTOR_ETP ACTOR_CP ACTOR_VPP FSDP_SIZE NNODES_TRAIN NNODES_ROLLOUT ALL_OFFLOAD RAY_DATA_HOME MODEL_ID
    VAL_BEFORE_TRAIN USE_KL_LOSS USE_KL_IN_REWARD USE_DYNAMIC_BSZ TEMPERATURE TOP_P TOP_K VAL_TEMPERATURE VAL_TOP_P)
set_by_user() {  # whether variable $1 came with the environment the script started with (not a script's default)
    if [ -r "/proc/$$/environ" ]; then
        tr '\0' '\n' < "/proc/$$/environ" | grep -q "^$1="
    else
        declare -p "$1" 2>/dev/null | grep -q '^declare -[a-zA-Z]*x'
    fi
}
read_verl_names() {
    local pair ours theirs read=() ignored=()
    for pair in "${VERL_NAMES[@]}"; do
        ours=${pair%%=*} theirs=${pair#*=}
        [ -n "${!theirs:-}" ] || continue
        if set_by_user "$ours"; then  # the knob itself wins
            ignored+=("$theirs (as $ours is set)")
        else
            printf -v "$ours" '%s' "${!theirs}"
            read+=("$theirs -> $ours=${!theirs}")
        fi
    done
    for theirs in "${VERL_OTHERS[@]}"; do
        [ -z "${!theirs:-}" ] || ignored+=("$theirs")
    done
    [ ${#read[@]} -eq 0 ] || echo "[examples] verl's variables read as these scripts' knobs: ${read[*]}" >&2
    [ ${#ignored[@]} -eq 0 ] || echo "[examples] ignored, no knob of these scripts: ${ignored[*]}; pass rlplat" \
        "overrides as arguments instead (docs/migrating.md maps verl's keys; examples/common.sh lists the knobs)" >&2
}
read_verl_names

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
#   LOG_PROB_MICRO_BATCH_SEQS  actor., ref. and teacher.log_prob_micro_batch_size_seqs_per_worker (log-prob passes)
#   VAL_N               rollout.val_n: responses per validation prompt (> 1 with VAL_TEMPERATURE > 0)
#   TRUNCATION          data.truncation: error | left | right | filter (drop prompts over MAX_PROMPT_LEN)
#   VAL_BATCH_PROMPTS   data.val_batch_size_prompts: prompts per validation call
#   VAL_TEMPERATURE     rollout.val_temperature (0 = greedy)
#   GRAD_CKPT           model.gradient_checkpointing (FSDP): true = recompute activations in backward
#   MICRO_BATCH_TOKENS  actor.micro_batch_max_tokens_per_worker: a token budget per micro-batch
#   RECOMPUTE           actor.megatron.recompute_activations (Megatron)
#   EP                  actor.megatron.expert_model_parallel_size (Megatron): ranks a mixture of experts' experts are
#                       shared out over (docs/moe.md)
#   PARAMS_DTYPE        actor.megatron.params_dtype: fp32 | bf16 (bf16 weights, fp32 masters in the optimizer; GPU)
#   ROUTER_REPLAY       actor.moe.router_replay: none | r2 | r3 (a mixture of experts' routing replay, docs/moe.md)
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
#   ULYSSES             actor., ref. and teacher.fsdp.ulysses_size: workers each sequence is split over
#                       (Ulysses sequence parallelism, FSDP; docs/long_context.md)
#   IMAGE_MAX_PIXELS    data.image_max_pixels: a vision-language model's largest image, in pixels (docs/vision.md)
#   TEACHER             teacher.model_path: on-policy distillation's teacher (ALGO=opd, or algorithm.distill.coef > 0;
#                       docs/distillation.md), a model with the student's tokenizer
#   TEACHER_PLACEMENT   teacher.placement: colocated (in the actor's workers) | separate (a pool of its own)
#   TEACHER_WORKERS     teacher.workers_per_node: the separate teacher pool's workers (devices)
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
    if [ "$ACTOR" != megatron ] && { [ "$TP" != 1 ] || [ "$PP" != 1 ] || [ "${EP:-1}" != 1 ]; }; then
        echo "TP=$TP PP=$PP EP=${EP:-1}: Megatron's training parallel sizes, used with ACTOR=megatron only" \
             "(ACTOR=$ACTOR);" \
             "the rollout engine's tensor parallelism is ROLLOUT_TP" >&2
        exit 2
    fi
    optional MICRO_BATCH_SEQS actor.micro_batch_size_seqs_per_worker critic.micro_batch_size_seqs_per_worker
    optional LOG_PROB_MICRO_BATCH_SEQS actor.log_prob_micro_batch_size_seqs_per_worker \
        ref.log_prob_micro_batch_size_seqs_per_worker teacher.log_prob_micro_batch_size_seqs_per_worker
    optional TRUNCATION data.truncation
    optional VAL_BATCH_PROMPTS data.val_batch_size_prompts
    optional VAL_N rollout.val_n
    optional VAL_TEMPERATURE rollout.val_temperature
    optional GRAD_CKPT model.gradient_checkpointing
    optional MICRO_BATCH_TOKENS actor.micro_batch_max_tokens_per_worker
    optional RECOMPUTE actor.megatron.recompute_activations
    optional EP actor.megatron.expert_model_parallel_size
    optional PARAMS_DTYPE actor.megatron.params_dtype
    optional ROUTER_REPLAY actor.moe.router_replay
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
    optional ULYSSES actor.fsdp.ulysses_size ref.fsdp.ulysses_size teacher.fsdp.ulysses_size
    optional IMAGE_MAX_PIXELS data.image_max_pixels
    optional TEACHER teacher.model_path
    optional TEACHER_PLACEMENT teacher.placement
    optional TEACHER_WORKERS teacher.workers_per_node
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
