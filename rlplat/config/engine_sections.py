"""The engines' own sections of the configuration schema (:mod:`rlplat.config.schema`, which holds them): each
training engine's (``<role>.fsdp``, ``<role>.megatron``, ``actor.moe``) and each rollout engine's (``rollout.hf``,
``rollout.vllm``, ``rollout.sglang``, ``rollout.server``). Each field's meaning is the comment next to it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


def count(default: int | None):
    """A field that counts something (a batch size, a length, a number of steps or workers): validation
    requires it to be >= 1 once the config is composed (None defaults are derived first, see derive.py)."""
    return field(default=default, metadata={"count": True})


@dataclass
class FSDPConfig:
    param_offload: bool = False  # GPU only: FSDP2 CPU offload of sharded params, grads and optimizer state
    reshard_after_forward: bool = True  # free gathered weights after forward (ZeRO-3 style)
    mixed_precision: str = "auto"  # auto = bf16 compute / fp32 reduce on GPU, none on CPU | none | bf16 (GPU only)
    # forward passes on each micro-batch's sequences packed end to end, without padding (position ids restart
    # per sequence; checked against the padded forward at start-up, padded if the model differs)
    pack_sequences: bool = True
    # Ulysses sequence parallelism: each sequence split over this many workers, which attend over the whole
    # sequence for 1/U of the heads each (must divide the attention heads and the workers; docs/long_context.md)
    ulysses_size: int = count(1)
    # how log-probs and entropy come out of the output layer (rlplat.engines.token_head), in chunks without full
    # logits: chunked (eager torch) | fused (each chunk's passes compiled by torch.compile) | liger (liger-kernel's
    # fused linear cross-entropy: a GPU and the liger-kernel package) | auto = fused on a GPU, chunked on CPU
    token_head: str = "auto"
    # compile each decoder layer with torch.compile (regional: FSDP2's per-layer hooks stay); None = on a GPU for
    # a dense text model without Ulysses (1.8x the update's speed at 0.5B with the fused head: docs/gpu.md), not
    # on CPU (compiling costs more than it saves there)
    compile: Optional[bool] = None

    @staticmethod
    def replica_size(section) -> int:
        """Workers one model replica spans (the section's declaration, read by the batch sizes and the plan):
        a sequence's Ulysses ranks."""
        return section.ulysses_size


@dataclass
class MegatronConfig:
    tensor_model_parallel_size: int = count(1)  # workers one model replica is split over (must divide the heads)
    pipeline_model_parallel_size: int = count(1)  # stages of layers, run by Megatron-Core's 1F1B schedule
    # a mixture of experts: ranks its experts are shared out over (folded over the tensor x data-parallel ranks of a
    # stage; must divide the experts and the workers; docs/moe.md)
    expert_model_parallel_size: int = count(1)
    recompute_activations: bool = False  # recompute each layer's activations in backward (saves memory)
    # split the norms' and dropouts' activations along the sequence over the tensor-parallel ranks (tp > 1)
    sequence_parallel: bool = False
    # shard AdamW's state (moments; fp32 masters of bf16 weights) over the data-parallel replicas (ZeRO-1; a
    # mixture of experts' experts: over the ranks that hold the same experts)
    use_distributed_optimizer: bool = True
    # auto = bf16 compute (CUDA autocast) with fp32 weights on GPU, fp32 on CPU | none | bf16 (GPU only)
    mixed_precision: str = "auto"
    # fp32 | bf16: bf16 weights, gradients summed in fp32, stepped through fp32 master copies in the (sharded)
    # optimizer (Megatron-LM's recipe: half the weights' memory; for GPUs, and needs mixed_precision auto or bf16)
    params_dtype: str = "fp32"

    @staticmethod
    def replica_size(section) -> int:
        """Workers one model replica spans: its tensor- x pipeline-parallel ranks."""
        return section.tensor_model_parallel_size * section.pipeline_model_parallel_size


def colocated_megatron(**keys) -> MegatronConfig:
    """The Megatron section of a frozen model colocated with the actor: the actor's parallel layout (a worker holds
    one Megatron-Core model-parallel state), and ``keys``."""
    layout = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "expert_model_parallel_size",
              "sequence_parallel")
    return MegatronConfig(**{key: f"${{actor.megatron.{key}}}" for key in layout}, **keys)


@dataclass
class MoEConfig:
    # weight of the routers' load-balancing loss added to the actor loss (Switch Transformer's, pooled over the
    # sparse layers as transformers computes it); None = the model config's router_aux_loss_coef; 0 = off
    # (the moe/* metrics are reported either way; docs/moe.md)
    aux_loss_coef: Optional[float] = None
    # routing replay: none | r2 = the update replays the routing of the actor's log-prob pass | r3 = every training
    # forward replays the rollout engine's routing (tokens go to the experts they went to when sampled)
    router_replay: str = "none"


@dataclass
class HFRolloutConfig:
    batch_size_seqs_per_worker: int = count(256)  # sequences sampled together on one worker
    use_model_generation_config: bool = False  # let the model's generation_config.json add sampling settings
    # dense Qwen2 / Llama: sample with rlplat's short forward over the model's weights (checked against the
    # model's forward at start-up; faster on small models: docs/performance.md); false = the model's own forward
    dense_forward: bool = True


@dataclass
class VLLMRolloutConfig:
    tensor_parallel_size: int = count(1)  # GPUs one engine spans (1 = one engine per worker)
    gpu_memory_utilization: float = 0.5  # GPU: fraction of device memory vLLM takes (weights + KV cache)
    kv_cache_gb: Optional[float] = None  # KV cache size; None = from gpu_memory_utilization on GPU, 1 GiB on CPU
    max_model_len: Optional[int] = None  # None = data.max_prompt_length + data.max_response_length
    max_num_seqs: int = count(256)  # sequences vLLM schedules at once
    load_format: str = "dummy"  # dummy = random init, the actor's weights arrive before generating | auto = read model.path
    enforce_eager: Optional[bool] = None  # no CUDA graphs / compilation; None = eager on CPU only
    enable_prefix_caching: bool = True  # share the KV cache of a prompt's n samples
    sleep_level: int = 1  # between rollouts: 0 = stay resident, 1 = offload weights + free KV cache, 2 = free both


@dataclass
class SGLangRolloutConfig:
    tensor_parallel_size: int = count(1)  # GPUs one engine spans
    mem_fraction_static: float = 0.5  # fraction of GPU memory for weights + KV cache
    max_model_len: Optional[int] = None  # None = data.max_prompt_length + data.max_response_length
    load_format: str = "dummy"  # dummy = random init, the actor's weights arrive before generating | auto
    sleep: bool = True  # release weights and KV cache between rollouts (SGLang's memory saver)


@dataclass
class RolloutServerConfig:
    url: Optional[str] = None  # rollout.mode=server: base URL of the running server, e.g. http://10.0.0.5:8000
    timeout_s: float = 600.0  # per request (a generation request covers a worker's whole batch)
