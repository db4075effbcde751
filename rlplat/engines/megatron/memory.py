"""The Megatron-Core engine's memory declarations for the plan (:mod:`rlplat.planner`; the defaults they
replace: :mod:`rlplat.engines.memory`). Formulas and their one calibrating measurement: docs/plan.md."""

from __future__ import annotations

from omegaconf import DictConfig

from rlplat.engines.memory import MemoryLayout, kept, model_state
from rlplat.models.shape import ModelShape


def layout(section: DictConfig, replicas: int) -> MemoryLayout:
    """Each model split over tensor x pipeline-parallel ranks; AdamW's state also over the data-parallel
    replicas with the distributed optimizer (ZeRO-1)."""
    tp, pp = section.tensor_model_parallel_size, section.pipeline_model_parallel_size
    return MemoryLayout(shard=tp * pp, optimizer_shard=tp * pp * (replicas if section.use_distributed_optimizer else 1),
                        tp=tp, pp=pp, replicas=replicas)


def expert_params(shape: ModelShape) -> int:
    """A mixture of experts' routed experts' parameters (0 for a dense model)."""
    return shape.sparse_layers * shape.experts * 3 * shape.hidden * shape.expert_intermediate


def state(shape: ModelShape, cfg: DictConfig, role: str, lay: MemoryLayout, trained: bool) -> dict[str, float]:
    """``params_dtype=bf16``: bf16 weights, fp32 (main) gradients, and fp32 master copies beside the moments in
    the (sharded) optimizer; fp32 weights: as any engine's (:func:`~rlplat.engines.memory.model_state`). A mixture
    of experts' experts are shared out over the expert-parallel ranks (each whole) instead: a rank holds 1 / (ep x
    pp) of them, beside 1 / (tp x pp) of the other weights; the distributed optimizer shares their state out over
    the tp x dp / ep ranks that hold the same experts (their expert-data-parallel group)."""
    section = cfg[role].megatron
    experts = expert_params(shape)
    if section.params_dtype != "bf16" and not experts:
        return model_state(shape, cfg, role, lay, trained)
    weight_bytes = 2 if section.params_dtype == "bf16" else 4
    per_rank = (shape.params - experts) / lay.shard  # the weights this rank holds
    stepped = per_rank * lay.shard / lay.optimizer_shard  # of those, the share whose optimizer state it keeps
    parts = {f"{role} weights ({'bf16' if weight_bytes == 2 else 'fp32'})": weight_bytes * per_rank}
    if experts:
        ep = section.expert_model_parallel_size
        held = experts / (ep * lay.pp)
        parts[f"{role} expert weights, {shape.experts // ep} of {shape.experts} per "
              f"layer ({'bf16' if weight_bytes == 2 else 'fp32'})"] = weight_bytes * held
        per_rank += held
        stepped += held / (max(1, lay.tp * lay.replicas // ep) if section.use_distributed_optimizer else 1)
    if trained:
        parts[f"{role} gradients (fp32)"] = 4 * per_rank
        if weight_bytes == 2:
            parts[f"{role} fp32 master weights"] = 4 * stepped
        parts[f"{role} AdamW moments (fp32)"] = 8 * stepped
    return parts


def activations(shape: ModelShape, cfg: DictConfig, lay: MemoryLayout, tokens: int, response_tokens: int,
                compute_bytes: int, grad: bool, seq: int) -> dict[str, float]:
    """Local (not TransformerEngine) layers: the attention keeps its ``[heads, T, T]`` scores (compute dtype) and
    their float32 softmax; the MLP keeps fc1's output and the activation (3 x the MLP width: a mixture of experts'
    top-k experts' together); the output layer's vocabulary-parallel logits and three float32 working tensors;
    recomputed with ``actor.megatron.recompute_activations``."""
    per_token = (compute_bytes * (8 * shape.hidden + 2 * shape.kv_heads * shape.head_dim + 3 * shape.mlp_width)
                 + shape.heads * seq * (compute_bytes + 8)) / lay.tp
    head = tokens * shape.vocab / lay.tp * compute_bytes + 3 * 4 * response_tokens * shape.vocab / lay.tp
    return kept(shape, lay, tokens, per_token, head, compute_bytes, grad, cfg.actor.megatron.recompute_activations)
