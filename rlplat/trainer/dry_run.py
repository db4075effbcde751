"""A run's plan, checked before any worker starts or any GPU is touched: ``trainer.dry_run=true`` on the main
command, or ``python -m rlplat.tools.plan [overrides ...] [--device-memory 80GB]`` (:mod:`rlplat.tools.plan`).

Takes the run's own overrides and, without a GPU and without training:

1. resolves and validates the config as a run does, builds the reward functions (names, custom reward
   files) and imports ``trainer.imports``;
2. reads the data with the run's tokenizer and chat template: the prompt-length distribution of each split,
   and what ``data.truncation`` does to prompts longer than ``data.max_prompt_length`` (with ``error``, the
   count, the longest and the first row, and the knobs: stopped here, not after start-up);
3. prints the batch ledger: prompts, sequences and tokens per step, mini-batches, optimizer steps and
   micro-batches per worker, steps per epoch;
4. estimates the memory of one device in each phase (rollout, log-prob passes, update) from the model's
   config and the engines' settings, and flags each phase that does not fit ``--device-memory`` with the
   knob to turn;
5. estimates validation's cost and a checkpoint's size on disk.

The formulas, their sources and the measured error are in docs/plan.md. Exit status: 0 = every phase fits,
1 = a phase does not fit, 2 = the config, data or rewards are wrong (one line, as the run would print).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from omegaconf import DictConfig

from rlplat.config.derive import data_parallel_replicas
from rlplat.engines.token_head import CHUNK_BYTES as HEAD_CHUNK_BYTES  # float32 logits per chunk
from rlplat.rollout.agent_loop import prompt_tools

GB = 10**9
GIB = 2**30
#: how many chunk-sized float32 tensors the output layer's backward holds at once (logits, probabilities,
#: their gradient, the entropy term)
HEAD_CHUNK_TENSORS = 4


@dataclass(frozen=True)
class ModelShape:
    """What the estimates need of a decoder-only causal LM's config (Qwen2 / Llama layout)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    qkv_bias: bool

    @classmethod
    def from_config(cls, config) -> ModelShape:
        heads = config.num_attention_heads
        return cls(layers=config.num_hidden_layers, hidden=config.hidden_size, heads=heads,
                   kv_heads=getattr(config, "num_key_value_heads", None) or heads,
                   head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
                   intermediate=config.intermediate_size, vocab=config.vocab_size,
                   tied=bool(getattr(config, "tie_word_embeddings", False)),
                   qkv_bias=bool(getattr(config, "attention_bias", config.model_type == "qwen2")))

    @property
    def layer_params(self) -> int:
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if self.qkv_bias else 0)
        return attention + 3 * h * self.intermediate + 2 * h  # + gate/up/down, two RMSNorms

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden

    def saved_bytes_per_token(self, compute_bytes: int) -> float:
        """Bytes one decoder layer keeps for the backward pass per token, as rlplat's FSDP engine runs it
        (Hugging Face's layer with SDPA attention, rlplat's gated MLP), counted with saved-tensor hooks
        (docs/plan.md): 8 hidden-size tensors (each RMSNorm's input, normalised value and output; the
        attention's query and output), key and value, the MLP's gate and up projections, one log-sum-exp
        per head and the norms' two float32 scalars. With bf16 compute each RMSNorm keeps its input as
        float32 (Hugging Face's RMSNorm computes in float32)."""
        kv = self.kv_heads * self.head_dim
        elements = 8 * self.hidden + 2 * kv + 2 * self.intermediate
        return compute_bytes * elements + 4 * (self.heads + 2) + 2 * self.hidden * (4 - compute_bytes)

    def eager_attention_extra(self, seq: int, compute_bytes: int) -> float:
        """What eager attention keeps per token and layer beyond SDPA's: its ``[heads, T, T]`` probabilities
        (float32 softmax, and their cast back in bf16), and key and value repeated to every query head; no
        log-sum-exp."""
        probabilities = self.heads * seq * (4 + (compute_bytes if compute_bytes < 4 else 0))
        repeated = 2 * (self.heads - self.kv_heads) * self.head_dim * compute_bytes
        return probabilities + repeated - 4 * self.heads

    def kv_cache_bytes_per_token(self, dtype_bytes: int) -> int:
        return self.layers * 2 * self.kv_heads * self.head_dim * dtype_bytes


@dataclass
class Phase:
    """One phase's estimate on one device: named parts in bytes."""

    name: str
    parts: dict[str, float] = field(default_factory=dict)
    knob: str = ""  # what to turn when it does not fit

    @property
    def total(self) -> float:
        return sum(self.parts.values())


def fmt(nbytes: float) -> str:
    return f"{nbytes / GIB:.2f} GiB" if nbytes >= 0.1 * GIB else f"{nbytes / 2**20:.1f} MiB"


# ---------------------------------------------------------------------------------------------- the ledger

@dataclass(frozen=True)
class Ledger:
    prompts: int  # per step, global
    sequences: int
    workers: int
    replicas: int  # data-parallel replicas of the actor
    max_prompt: int
    max_response: int
    mini_batches: int
    optimizer_steps: int  # per training step
    micro_batches: int  # per mini-batch and worker
    micro_seqs: int
    micro_tokens: int  # the most tokens one update micro-batch computes
    logprob_micro_tokens: int
    steps_per_epoch: float
    epochs: float

    @property
    def max_tokens(self) -> int:
        return self.sequences * self.length

    @property
    def length(self) -> int:
        """The longest sequence: the longest prompt (after truncation) and a full response."""
        return self.max_prompt + self.max_response

    @property
    def sequences_per_replica(self) -> int:
        return self.sequences // self.replicas


def ledger(cfg: DictConfig, plan, train_rows: int, replicas: int, longest_prompt: int) -> Ledger:
    """The batch ledger; a batch's prompts are padded to its longest, at most ``longest_prompt`` (the data's
    longest after truncation), so the sequence length is that plus the response length
    (``data.max_response_length``, or an agent loop's ``rollout.agent.max_total_tokens``)."""
    data, actor = cfg.data, cfg.actor
    sequences = data.train_batch_size_prompts * cfg.rollout.n
    mini_seqs = actor.mini_batch_size_prompts * cfg.rollout.n // replicas
    micro_seqs = min(actor.micro_batch_size_seqs_per_worker, mini_seqs)
    length = longest_prompt + plan.response_length
    budget = actor.micro_batch_max_tokens_per_worker
    micro_tokens = min(budget, micro_seqs * length) if budget else micro_seqs * length
    micro_batches = math.ceil(mini_seqs * length / budget) if budget else math.ceil(mini_seqs / micro_seqs)
    logprob_seqs = min(actor.log_prob_micro_batch_size_seqs_per_worker, sequences // replicas)
    logprob_tokens = min(budget, logprob_seqs * length) if budget else logprob_seqs * length
    steps_per_epoch = train_rows / data.train_batch_size_prompts
    return Ledger(prompts=data.train_batch_size_prompts, sequences=sequences, workers=plan.world_size,
                  replicas=replicas, max_prompt=longest_prompt, max_response=plan.response_length,
                  mini_batches=plan.mini_batches_per_step, optimizer_steps=plan.mini_batches_per_step * actor.ppo_epochs,
                  micro_batches=micro_batches, micro_seqs=micro_seqs, micro_tokens=micro_tokens,
                  logprob_micro_tokens=logprob_tokens, steps_per_epoch=steps_per_epoch,
                  epochs=cfg.trainer.total_steps / steps_per_epoch)


# ---------------------------------------------------------------------------------------------- memory

def _dtype_bytes(name: str) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2}[name]


@dataclass(frozen=True)
class Layout:
    """How the actor's model is split over one device's worker."""

    strategy: str
    shard: int  # the weights and gradients are divided by this
    optimizer_shard: int  # AdamW's moments are divided by this
    tp: int = 1
    pp: int = 1
    replicas: int = 1
    sp: int = 1  # FSDP's Ulysses size: each worker holds 1/sp of every sequence's activations


def layout(cfg: DictConfig, role: str, world: int) -> Layout:
    section, replicas = cfg[role], data_parallel_replicas(cfg, role, world)
    if section.strategy == "megatron":
        m = section.megatron
        tp, pp = m.tensor_model_parallel_size, m.pipeline_model_parallel_size
        return Layout("megatron", tp * pp, tp * pp * (replicas if m.use_distributed_optimizer else 1), tp, pp,
                      replicas)
    return Layout("fsdp", world, world, replicas=replicas, sp=section.fsdp.ulysses_size)


def actor_state(shape: ModelShape, lay: Layout, compute_bytes: int, cfg: DictConfig, trained: bool,
                role: str = "actor") -> dict[str, float]:
    """The weights (float32 master weights) and, for a trained model, gradients and AdamW's moments, on one
    device; with bf16 compute the bf16 copies FSDP gathers (one layer at a time, plus the next one it
    prefetches, or every layer when ``reshard_after_forward=false``). Megatron's bf16 weights
    (``params_dtype=bf16``): bf16 weights, fp32 (main) gradients, and fp32 master copies beside the moments."""
    params = shape.params
    offloaded = lay.strategy == "fsdp" and cfg[role].fsdp.param_offload
    if lay.strategy == "megatron" and cfg[role].megatron.params_dtype == "bf16":
        parts = {f"{role} weights (bf16)": 2 * params / lay.shard}
        if trained:
            parts[f"{role} gradients (fp32)"] = 4 * params / lay.shard
            parts[f"{role} fp32 master weights"] = 4 * params / lay.optimizer_shard
            parts[f"{role} AdamW moments (fp32)"] = 8 * params / lay.optimizer_shard
        return parts
    parts = {f"{role} weights (fp32)": 0.0 if offloaded else 4 * params / lay.shard}
    adapters = lora_params(shape, cfg.model.lora) if role == "actor" and cfg.model.lora.rank else None
    if adapters is not None:  # LoRA: the adapters are trained, the base weights frozen (no gradients or moments)
        parts[f"{role} LoRA adapters (fp32)"] = 0.0 if offloaded else 4 * adapters / lay.shard
        if cfg.ref.sync_steps > 0 and cfg.ref.placement == "colocated":  # the synced reference's adapters
            parts["reference's LoRA adapters (fp32)"] = 0.0 if offloaded else 4 * adapters / lay.shard
    trained_params = params if adapters is None else adapters
    if trained:
        parts[f"{role} gradients (fp32)"] = 0.0 if offloaded else 4 * trained_params / lay.shard
        parts[f"{role} AdamW moments (fp32)"] = 0.0 if offloaded else 8 * trained_params / lay.optimizer_shard
    if compute_bytes < 4 and lay.strategy == "fsdp":
        gathered = params if not cfg[role].fsdp.reshard_after_forward else 2 * shape.layer_params
        parts[f"{role} bf16 compute copies"] = compute_bytes * gathered
    return parts


def _linear_shapes(shape: ModelShape) -> dict[str, tuple[int, int]]:
    """The decoder layer's linear layers (Qwen2 / Llama names) and their (input, output) widths."""
    h, q, kv, i = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.intermediate
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def lora_params(shape: ModelShape, lora_cfg: DictConfig) -> int:
    """The LoRA adapters' parameters: r x (input + output width) for each adapted linear layer of each decoder
    layer (``model.lora.target_modules``; [] = all of them)."""
    linears = _linear_shapes(shape)
    targets = list(lora_cfg.target_modules) or list(linears)
    return shape.layers * sum(lora_cfg.rank * sum(linears[name]) for name in targets if name in linears)


def activation_bytes(shape: ModelShape, cfg: DictConfig, lay: Layout, tokens: int, response_tokens: int,
                     compute_bytes: int, grad: bool, seq: int) -> dict[str, float]:
    """What a forward pass over ``tokens`` on one worker holds: with ``grad``, every layer's saved tensors
    (or, with recomputation, each layer's input and one layer's tensors); without, one layer's tensors;
    plus the output layer's working set."""
    layers = shape.layers / lay.pp
    if lay.strategy == "megatron":
        # local (not TransformerEngine) layers: the attention keeps its [heads, T, T] scores (compute dtype)
        # and their float32 softmax; the MLP keeps fc1's output and the activation (3 x the MLP width);
        # calibrated against one measurement (docs/plan.md)
        per_token = (compute_bytes * (8 * shape.hidden + 2 * shape.kv_heads * shape.head_dim + 3 * shape.intermediate)
                     + shape.heads * seq * (compute_bytes + 8)) / lay.tp
        recompute = cfg.actor.megatron.recompute_activations
        head = tokens * shape.vocab / lay.tp * compute_bytes + 3 * 4 * response_tokens * shape.vocab / lay.tp
    else:
        per_token = shape.saved_bytes_per_token(compute_bytes)
        if cfg.model.attn_implementation == "eager" and lay.sp == 1:  # Ulysses attends with its own fused calls
            per_token += shape.eager_attention_extra(seq, compute_bytes)
        recompute = cfg.model.gradient_checkpointing
        chunk_rows = max(1, HEAD_CHUNK_BYTES // (4 * shape.vocab))
        head = HEAD_CHUNK_TENSORS * 4 * shape.vocab * min(chunk_rows, response_tokens) \
            + response_tokens * shape.hidden * compute_bytes  # the response positions' hidden states
        tokens, head = -(-tokens // lay.sp), head / lay.sp  # Ulysses: this worker's slice of the sequences
    if not grad:
        return {"activations (one layer at a time)": per_token * tokens, "output layer": head}
    if recompute:
        kept = tokens * shape.hidden * compute_bytes * layers + per_token * tokens
        return {"activations (recomputed: layer inputs + one layer)": kept, "output layer": head}
    return {"activations saved for backward": per_token * tokens * layers, "output layer": head}


def rollout_parts(shape: ModelShape, cfg: DictConfig, plan, lay: Layout, sequences_per_worker: int,
                  length: int, device_memory: int) -> tuple[dict[str, float], str]:
    """The rollout engine's memory on one device while it generates sequences of up to ``length`` tokens,
    and the knob for it."""
    dtype = _dtype_bytes(plan.rollout_dtype)
    name = cfg.rollout.name
    if name in ("vllm", "sglang"):
        section = cfg.rollout[name]
        fraction = section.gpu_memory_utilization if name == "vllm" else section.mem_fraction_static
        key = f"rollout.{name}.{'gpu_memory_utilization' if name == 'vllm' else 'mem_fraction_static'}"
        reserved = fraction * device_memory if plan.device == "cuda" else \
            (section.get("kv_cache_gb") or 1) * GIB + dtype * shape.params / section.tensor_parallel_size
        return {f"{name} reservation ({key}={fraction:g})": reserved}, \
            f"lower {key}, or rollout.{name}.tensor_parallel_size > 1"
    rows = min(cfg.rollout.hf.batch_size_seqs_per_worker, sequences_per_worker)
    parts = {}
    # the HF engine samples with the actor's weights when they are whole on this device in its dtype (and not
    # LoRA's: the engine holds the merged weights, or its own base weights with the adapters)
    if not (lay.strategy == "fsdp" and lay.shard == 1 and dtype == 4 and not cfg.model.lora.rank):
        parts[f"rollout weights ({plan.rollout_dtype})"] = dtype * shape.params
    parts[f"KV cache ({rows} sequences x {length} tokens)"] = rows * length * shape.kv_cache_bytes_per_token(dtype)
    return parts, "lower rollout.hf.batch_size_seqs_per_worker, data.max_response_length or the batch"


def phases(shape: ModelShape, cfg: DictConfig, plan, led: Ledger, device_memory: int) -> list[Phase]:
    """Rollout, log-prob passes and the update, on one actor device."""
    lay = layout(cfg, "actor", plan.world_size)
    compute = _dtype_bytes(plan.actor_dtype)
    resident = actor_state(shape, lay, compute, cfg, trained=True)
    grads = next(k for k in resident if "gradients" in k)
    # the gradients exist from the first backward to the optimizer step (FSDP frees them after it; a
    # one-worker float32 module keeps them in one buffer for the whole run)
    keeps_grads = lay.strategy == "fsdp" and lay.shard == 1 and compute == 4 and not cfg.actor.fsdp.param_offload
    between = {k: v for k, v in resident.items() if k != grads or keeps_grads}
    ref = {}
    if plan.reference == "colocated":
        ref = actor_state(shape, layout(cfg, "ref", plan.world_size), compute, cfg, trained=False, role="ref")
    critic = {}
    if plan.needs_critic:  # the same backbone with a one-output head, trained on the same devices
        critic_state = actor_state(shape, layout(cfg, "critic", plan.world_size), compute, cfg, trained=True,
                                   role="critic")
        critic = {k: v for k, v in critic_state.items() if "gradients" not in k}
    response_share = led.max_response / (led.max_prompt + led.max_response)
    separate = cfg.rollout.mode == "separate"  # the rollout engines have devices of their own
    rollout_workers = cfg.rollout.nnodes * cfg.rollout.workers_per_node
    rollout_layout = Layout("none", 1, 1, 1) if separate else lay  # a rollout worker holds no actor weights
    rollout, rollout_knob = rollout_parts(shape, cfg, plan, rollout_layout,
                                          -(-led.sequences // rollout_workers) if separate else led.sequences_per_replica,
                                          led.length, device_memory)
    if plan.rollout_sleeps or separate:  # vLLM / SGLang release their memory outside the rollout
        between_rollouts = {}
    else:
        between_rollouts = {k: v for k, v in rollout.items() if not k.startswith("KV cache")}
    logprob = activation_bytes(shape, cfg, lay, led.logprob_micro_tokens,
                               int(led.logprob_micro_tokens * response_share), compute, grad=False, seq=led.length)
    update = activation_bytes(shape, cfg, lay, led.micro_tokens, int(led.micro_tokens * response_share),
                              compute, grad=True, seq=led.length)
    knob_update = ("model.gradient_checkpointing=true, a smaller actor.micro_batch_size_seqs_per_worker or "
                   "actor.micro_batch_max_tokens_per_worker" if lay.strategy == "fsdp" else
                   "actor.megatron.recompute_activations=true, a larger tensor/pipeline parallel size or a "
                   "smaller micro-batch")
    out = [
        Phase("rollout, on each rollout worker's device (rollout.mode=separate)", rollout, rollout_knob) if separate
        else Phase("rollout", {**between, **ref, **critic, **rollout}, rollout_knob),
        Phase("log-prob passes", {**between, **ref, **critic, **between_rollouts, **logprob},
              "actor.log_prob_micro_batch_size_seqs_per_worker (or a token budget)"),
        Phase("update", {**resident, **ref, **critic, **between_rollouts, **update}, knob_update),
    ]
    if plan.needs_critic:  # the critic's update: its gradients and activations beside the actor's state
        critic_update = {**between, **ref, **critic_state, **between_rollouts, **update}
        out.append(Phase("critic update", critic_update, "critic.micro_batch_size_seqs_per_worker or "
                                                          "model.gradient_checkpointing=true"))
    return out


# ---------------------------------------------------------------------------------------------- data

@dataclass(frozen=True)
class PromptLengths:
    split: str
    files: tuple[str, ...]
    lengths: tuple[int, ...]  # tokens per prompt, after the chat template
    first_over: str | None  # "file row N" of the first prompt over data.max_prompt_length

    def over(self, limit: int) -> int:
        return sum(length > limit for length in self.lengths)


def prompt_lengths(cfg: DictConfig, tokenizer, files: tuple[str, ...], split: str) -> PromptLengths:
    from rlplat.data import resolve_files
    from rlplat.data.dataset import prompt_token_lengths

    resolved = resolve_files(list(files), split)
    rows = prompt_token_lengths(resolved, tokenizer, cfg.data.apply_chat_template, prompt_tools(cfg.rollout.agent))
    limit = cfg.data.max_prompt_length
    first = next((where for where, length in rows if length > limit), None)
    return PromptLengths(split, tuple(str(f) for f in resolved), tuple(length for _, length in rows), first)


def check_lengths(cfg: DictConfig, scan: PromptLengths) -> str:
    """What ``data.truncation`` does to the over-long prompts of ``scan``; DataError for ``error``."""
    from rlplat.data import DataError

    limit, mode = cfg.data.max_prompt_length, cfg.data.truncation
    over = scan.over(limit)
    if not over:
        return "none longer than data.max_prompt_length"
    longest = max(scan.lengths)
    if mode == "error":
        raise DataError(f"{over} of {len(scan.lengths)} {scan.split} prompts are longer than data.max_prompt_length="
                        f"{limit} (the longest {longest} tokens; the first: {scan.first_over}); the run would stop "
                        f"there: set data.truncation=filter to drop them (verl's filter_overlong_prompts), "
                        f"left|right to cut them, or data.max_prompt_length={longest}")
    action = {"filter": "dropped", "left": "cut to their last tokens", "right": "cut to their first tokens"}[mode]
    return f"{over} longer than data.max_prompt_length={limit} (longest {longest}): {action} (data.truncation={mode})"


# ---------------------------------------------------------------------------------------------- the tool

def _percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def validation_cost(cfg: DictConfig, val_rows: int, length: int) -> dict[str, float]:
    calls = math.ceil(val_rows / cfg.data.val_batch_size_prompts)
    freq, steps = cfg.trainer.test_freq, cfg.trainer.total_steps
    count = 1 + (steps // freq if freq > 0 else 0) + (0 if freq > 0 and steps % freq == 0 else 1)
    return {"prompts": val_rows, "calls": calls, "responses": val_rows * cfg.rollout.val_n, "validations": count,
            "tokens": val_rows * cfg.rollout.val_n * length}


def checkpoint_bytes(shape: ModelShape, plan) -> dict[str, float]:
    """A checkpoint on disk: float32 weights and AdamW's two moments (12 bytes a parameter) per trained
    model, the reference's weights when it is synced, and the float32 Hugging Face export."""
    trained = 2 if plan.needs_critic else 1
    return {"checkpoint": 12 * shape.params * trained, "hf_export": 4 * shape.params}


def default_device_memory(device: str) -> int:
    """The visible GPU's memory, else 80 GB; on a CPU run, this machine's memory."""
    import os

    import torch

    if device == "cpu":
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(0).total_memory
    return 80 * GB


def missing_packages(cfg: DictConfig, plan) -> list[str]:
    """The chosen engines whose packages are not installed on this machine (planned all the same)."""
    from rlplat.engines import TRAINING_ENGINES
    from rlplat.rollout import ROLLOUT_ENGINES

    chosen = [(TRAINING_ENGINES, cfg.actor.strategy)]
    chosen += [(TRAINING_ENGINES, cfg[role].strategy) for role, used in (("critic", plan.needs_critic),
                                                                        ("ref", plan.needs_ref)) if used]
    if cfg.rollout.mode != "server":
        chosen.append((ROLLOUT_ENGINES, cfg.rollout.name))
    return list(dict.fromkeys(p for registry, name in chosen if (p := registry.missing_requirements(name))))


def colocated_scorers(cfg) -> list[str]:
    """The reward model and judge on the actor's devices, which the memory estimate does not count."""
    reward = cfg.reward
    found = [("the reward model (reward.model.path)", reward.model.path, reward.model.placement),
             ("the judge (reward.judge.model_path)", reward.judge.model_path, reward.judge.placement)]
    return [what for what, path, placement in found if path and placement == "colocated"]


def say(line: str = "") -> None:
    print(line, flush=True)


def report(cfg: DictConfig, plan, device_memory: int) -> bool:
    """Run the checks and print the plan; True when every phase fits ``device_memory``. Raises the run's
    own errors (ConfigError, DataError, RewardConfigError, RegistryError, RunError) for what would stop it."""
    shape, tokenizer = check_inputs(cfg, plan)
    scans = report_data(cfg, plan, tokenizer)
    kept = {split: len(s.lengths) - (s.over(cfg.data.max_prompt_length) if cfg.data.truncation == "filter" else 0)
            for split, s in scans.items()}
    if not kept["train"]:
        from rlplat.data import DataError

        raise DataError(f"every train prompt is longer than data.max_prompt_length={cfg.data.max_prompt_length} and "
                        f"data.truncation=filter drops them all: raise data.max_prompt_length")
    led = report_ledger(cfg, plan, scans["train"], kept["train"])
    fits = report_memory(shape, cfg, plan, led, device_memory)
    report_validation_and_disk(shape, cfg, plan, scans["test"], kept["test"])
    say("\nplan: every phase fits" if fits else "\nplan: a phase does not fit the device (see above)")
    return fits


def check_inputs(cfg: DictConfig, plan) -> tuple[ModelShape, object]:
    """Load what the run loads first (imports, reward functions, the model's config and tokenizer) and
    print the plan's header; returns the model's shape and tokenizer."""
    from transformers import AutoConfig, AutoTokenizer

    from rlplat.config.imports import import_user_modules
    from rlplat.reward import build_reward_manager
    from rlplat.trainer.preflight import check_model_path
    from rlplat.trainer.run import resolve_model_path
    from rlplat.models.embedded import is_embedded

    import_user_modules(cfg.trainer.imports)
    build_reward_manager(cfg.reward, cfg.algorithm.overlong_buffer, cfg.data.max_response_length).close()
    if not is_embedded(cfg.model.path):
        check_model_path(cfg.model.path)
    model_path = resolve_model_path(cfg)
    config = AutoConfig.from_pretrained(model_path, trust_remote_code=cfg.model.trust_remote_code)
    shape = ModelShape.from_config(config)
    tokenizer = AutoTokenizer.from_pretrained(cfg.model.tokenizer_path or model_path)
    rollout = cfg.rollout
    pool = (f" on {rollout.nnodes * rollout.workers_per_node} worker(s) of its own, "
            f"{cfg.trainer.async_steps} step(s) ahead" if rollout.mode == "separate" else "")
    say(f"rlplat plan: {cfg.algorithm.adv_estimator} on {plan.world_size} worker(s) ({plan.device}), "
        f"actor {cfg.actor.strategy}, rollout {rollout.name}{pool}; model {cfg.model.path} "
        f"({shape.params / 1e6:.1f}M parameters, {shape.layers} layers, hidden {shape.hidden}, vocabulary {shape.vocab})")
    say("config, reward functions and imports: ok")
    for problem in missing_packages(cfg, plan):
        say(f"note: {problem}; the run needs it where it runs")
    return shape, tokenizer


def report_data(cfg: DictConfig, plan, tokenizer) -> dict[str, PromptLengths]:
    """Scan the train and test prompts' lengths and print them; returns the scans by split."""
    say("\ndata (tokens per prompt, after the chat template)")
    scans = {}
    for split, files in (("train", plan.train_files), ("test", plan.val_files)):
        scan = prompt_lengths(cfg, tokenizer, files, split)
        scans[split] = scan
        lengths = list(scan.lengths)
        say(f"  {split}: {len(lengths)} prompts from {', '.join(scan.files)}; min {min(lengths)}, median "
            f"{int(statistics.median(lengths))}, p99 {_percentile(lengths, 0.99)}, max {max(lengths)}; "
            f"{check_lengths(cfg, scan)}")
    return scans


def report_ledger(cfg: DictConfig, plan, train: PromptLengths, kept: int) -> Ledger:
    """Print the batch ledger of one training step over the ``kept`` train prompts."""
    replicas = layout(cfg, "actor", plan.world_size).replicas
    led = ledger(cfg, plan, kept, replicas, min(cfg.data.max_prompt_length, max(train.lengths)))
    say("\nbatch ledger (per training step)")
    say(f"  {led.prompts} prompts x rollout.n={cfg.rollout.n} = {led.sequences} sequences over {led.replicas} "
        f"data-parallel replica(s): {led.sequences_per_replica} per replica")
    say(f"  tokens: at most {led.max_tokens:,} ({led.max_prompt} prompt + {led.max_response} response per sequence: "
        f"the longest prompt, padded to, and a full response); mean prompt {statistics.mean(train.lengths):.0f}")
    say(f"  {led.mini_batches} mini-batch(es) x actor.ppo_epochs={cfg.actor.ppo_epochs} = {led.optimizer_steps} "
        f"optimizer step(s); {led.micro_batches} micro-batch(es) of {led.micro_seqs} sequences "
        f"(at most {led.micro_tokens:,} tokens) per mini-batch and worker")
    say(f"  {led.steps_per_epoch:.1f} steps per epoch of {kept} prompts; trainer.total_steps="
        f"{cfg.trainer.total_steps} = {led.epochs:.2f} epochs")
    return led


def report_memory(shape: ModelShape, cfg: DictConfig, plan, led: Ledger, device_memory: int) -> bool:
    """Print each phase's memory estimate; True when every phase fits ``device_memory``."""
    say(f"\nmemory per {'device' if plan.device == 'cuda' else 'worker (CPU)'} (estimate, docs/plan.md) against "
        f"{device_memory / GB:.0f} GB")
    fits = True
    for phase in phases(shape, cfg, plan, led, device_memory):
        over = phase.total > device_memory
        fits &= not over
        say(f"  {phase.name}: {fmt(phase.total)}{'  DOES NOT FIT: ' + phase.knob if over else ''}")
        for name, nbytes in phase.parts.items():
            if nbytes:
                say(f"    {name:<52} {fmt(nbytes):>12}")
    if uncounted := colocated_scorers(cfg):
        say(f"  not counted: {' and '.join(uncounted)}, placed on these devices too (colocated)")
    return fits


def report_validation_and_disk(shape: ModelShape, cfg: DictConfig, plan, test: PromptLengths, kept: int) -> None:
    """Print what validation costs (over the ``kept`` test prompts) and what checkpoints take on disk."""
    val = validation_cost(cfg, kept, min(cfg.data.max_prompt_length, max(test.lengths)) + plan.response_length)
    say(f"\nvalidation: {val['prompts']} prompts x rollout.val_n={cfg.rollout.val_n} = {val['responses']} responses "
        f"in {val['calls']} call(s) of data.val_batch_size_prompts={cfg.data.val_batch_size_prompts}, "
        f"{val['validations']} time(s) (trainer.test_freq={cfg.trainer.test_freq}): at most {val['tokens']:,} "
        f"tokens each, at rollout.val_temperature={cfg.rollout.val_temperature:g}")
    disk = checkpoint_bytes(shape, plan)
    keep = cfg.trainer.max_checkpoints
    kept_bytes = f": {fmt(disk['checkpoint'] * keep)}" if keep > 0 else ""
    say(f"disk: {fmt(disk['checkpoint'])} per checkpoint (trainer.max_checkpoints={keep} kept{kept_bytes}), "
        f"{fmt(disk['hf_export'])} for hf_export")


def planned_device(overrides: list[str]) -> str | None:
    """``cuda`` when the overrides name ``trainer.device=cuda`` (a GPU run planned anywhere), else None (the
    run's own resolution)."""
    return "cuda" if "trainer.device=cuda" in overrides else None


def run_plan(cfg: DictConfig, plan, device_memory: int | None = None) -> int:
    """:func:`report` with the run's one-line errors and exit statuses (also ``trainer.dry_run=true``)."""
    from rlplat.trainer.exit_status import exit_status
    from rlplat.utils.quiet import quiet_third_party

    quiet_third_party(cfg.trainer.verbose)
    return exit_status(lambda: 0 if report(cfg, plan, device_memory or default_device_memory(plan.device)) else 1)

