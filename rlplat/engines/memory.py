"""What a training engine declares about its memory, for the plan's estimate (:mod:`rlplat.planner`): how it
splits the model over one replica's workers (:class:`MemoryLayout`), what one device holds of the model's
state, and what a forward pass keeps.

:class:`~rlplat.engines.base.TrainingEngine`'s declarations default to the functions here, which describe a
Hugging Face model (Qwen2 / Llama layout) held by each worker in float32 and trained with AdamW, so an engine
of one's own is planned without writing any; FSDP and Megatron-Core override what they do differently. The
formulas, their sources and the measured error are in docs/plan.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig

from rlplat.engines.token_head import CHUNK_BYTES as HEAD_CHUNK_BYTES  # float32 logits per chunk
from rlplat.models.shape import ModelShape, lora_params

#: how many chunk-sized float32 tensors the output layer's backward holds at once (logits, probabilities,
#: their gradient, the entropy term)
HEAD_CHUNK_TENSORS = 4


@dataclass(frozen=True)
class MemoryLayout:
    """How an engine's model is split over one device's worker."""

    shard: int = 1  # the weights and gradients are divided by this
    optimizer_shard: int = 1  # AdamW's moments are divided by this
    tp: int = 1  # tensor-parallel ranks (the activations are divided by this)
    pp: int = 1  # pipeline stages (each holds 1/pp of the layers)
    replicas: int = 1  # data-parallel replicas over the role's workers
    sp: int = 1  # sequence-parallel ranks: each worker holds 1/sp of every sequence's activations


def model_state(shape: ModelShape, cfg: DictConfig, role: str, lay: MemoryLayout, trained: bool,
                offloaded: bool = False) -> dict[str, float]:
    """The float32 weights and, for a trained model, gradients and AdamW's moments on one device, divided by the
    layout's shards (nothing on the device when ``offloaded`` to the host). With LoRA (the actor) the base
    weights are frozen and the adapters are what is trained, plus the synced reference's copy of them
    (``ref.sync_steps`` with a colocated reference). A frozen vision encoder (``actor.vision.freeze``) has no
    gradients or moments."""
    params = shape.params
    on_device = 0.0 if offloaded else 1.0
    parts = {f"{role} weights (fp32)": on_device * 4 * params / lay.shard}
    adapters = lora_params(shape, cfg.model.lora) if role == "actor" and cfg.model.lora.rank else None
    if adapters is not None:
        parts[f"{role} LoRA adapters (fp32)"] = on_device * 4 * adapters / lay.shard
        if cfg.ref.sync_steps > 0 and cfg.ref.placement == "colocated":
            parts["reference's LoRA adapters (fp32)"] = on_device * 4 * adapters / lay.shard
    trained_params = params if adapters is None else adapters
    if role == "actor" and adapters is None and cfg.actor.vision.freeze:
        trained_params -= shape.vision_params
    if trained:
        parts[f"{role} gradients (fp32)"] = on_device * 4 * trained_params / lay.shard
        parts[f"{role} AdamW moments (fp32)"] = on_device * 8 * trained_params / lay.optimizer_shard
    return parts


def hf_activations(shape: ModelShape, cfg: DictConfig, lay: MemoryLayout, tokens: int, response_tokens: int,
                   compute_bytes: int, grad: bool, seq: int) -> dict[str, float]:
    """A forward pass of a Hugging Face layer stack over ``tokens`` (SDPA attention, or eager's
    ``[heads, T, T]`` probabilities with ``model.attn_implementation=eager``; rlplat's gated MLP; recomputed
    with ``model.gradient_checkpointing``) and rlplat's chunked output layer, sequences split over ``lay.sp``
    workers (:func:`kept`)."""
    per_token = shape.saved_bytes_per_token(compute_bytes)
    if cfg.model.attn_implementation == "eager" and lay.sp == 1:  # Ulysses attends with its own fused calls
        per_token += shape.eager_attention_extra(seq, compute_bytes)
    chunk_rows = max(1, HEAD_CHUNK_BYTES // (4 * shape.vocab))
    head = HEAD_CHUNK_TENSORS * 4 * shape.vocab * min(chunk_rows, response_tokens) \
        + response_tokens * shape.hidden * compute_bytes  # the response positions' hidden states
    return kept(shape, lay, -(-tokens // lay.sp), per_token, head / lay.sp, compute_bytes, grad,
                cfg.model.gradient_checkpointing)


def kept(shape: ModelShape, lay: MemoryLayout, tokens: int, per_token: float, head: float, compute_bytes: int,
         grad: bool, recompute: bool) -> dict[str, float]:
    """What a forward pass over ``tokens`` on one worker holds, from a layer's bytes ``per_token`` and the output
    layer's working set ``head``: with ``grad``, every layer's saved tensors (or, with ``recompute``, each
    layer's input and one layer's tensors); without, one layer's tensors."""
    if not grad:
        return {"activations (one layer at a time)": per_token * tokens, "output layer": head}
    layers = shape.layers / lay.pp
    if recompute:
        inputs = tokens * shape.hidden * compute_bytes * layers + per_token * tokens
        return {"activations (recomputed: layer inputs + one layer)": inputs, "output layer": head}
    return {"activations saved for backward": per_token * tokens * layers, "output layer": head}
