"""What the plan's memory estimates need of a decoder-only causal LM's config (Qwen2 / Llama layout): its
sizes, parameter counts, the bytes a layer keeps for the backward pass and the KV cache's per token. The
formulas, their sources and the measured error are in docs/plan.md; the engines' memory declarations
(:meth:`rlplat.engines.TrainingEngine.memory_state` and the like) are written in them."""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig


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
    # a mixture of experts: routed experts per sparse layer, one expert's MLP width, experts per token, the width of
    # a shared expert every token also goes through (Qwen2-MoE), the sparse layers (the rest have a dense MLP of
    # ``intermediate``); 0 for a dense model
    experts: int = 0
    expert_intermediate: int = 0
    top_k: int = 0
    shared_intermediate: int = 0
    sparse_layers: int = 0
    qk_norm: int = 0  # a layer's RMSNorm weights over query and key: per head (Qwen3: 2 x head_dim), whole (OLMoE)
    vision_params: int = 0  # a vision-language model's vision encoder and merger (in params; its activations are not)

    @classmethod
    def from_config(cls, config) -> ModelShape:
        """The shape of ``config``'s language model; a vision-language model's also counts its vision encoder."""
        from rlplat.models.moe import num_experts, sparse_layers
        from rlplat.models.vision import is_vision

        vision = _vision_params(config) if is_vision(config) else 0
        config = config.get_text_config()
        heads, layers = config.num_attention_heads, config.num_hidden_layers
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        qk_norm = {"qwen3": 2 * head_dim, "qwen3_moe": 2 * head_dim, "olmoe": (heads + kv_heads) * head_dim}
        experts = num_experts(config)
        return cls(layers=layers, hidden=config.hidden_size, heads=heads, kv_heads=kv_heads, head_dim=head_dim,
                   intermediate=config.intermediate_size, vocab=config.vocab_size,
                   tied=bool(getattr(config, "tie_word_embeddings", False)),
                   qkv_bias=bool(getattr(config, "attention_bias", config.model_type in ("qwen2", "qwen2_moe"))),
                   experts=experts, top_k=config.num_experts_per_tok if experts else 0,
                   expert_intermediate=(getattr(config, "moe_intermediate_size", None) or config.intermediate_size)
                   if experts else 0,
                   shared_intermediate=getattr(config, "shared_expert_intermediate_size", None) or 0,
                   sparse_layers=len(sparse_layers(config)),
                   qk_norm=qk_norm.get(config.model_type, 0), vision_params=vision)

    def _layer_params(self, sparse: bool, experts: int) -> int:
        """One decoder layer's parameters: a dense one, or a sparse one counting ``experts`` of its experts."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        attention = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if self.qkv_bias else 0)
        attention += self.qk_norm
        if not sparse:
            return attention + 3 * h * self.intermediate + 2 * h  # + gate/up/down, two RMSNorms
        shared = 3 * h * self.shared_intermediate + h if self.shared_intermediate else 0  # + its gate
        return attention + experts * 3 * h * self.expert_intermediate + self.experts * h + shared + 2 * h  # + router

    @property
    def layer_params(self) -> int:
        """The largest decoder layer's parameters."""
        return self._layer_params(self.sparse_layers > 0, self.experts)

    def _params(self, experts: int) -> int:
        layers = (self.sparse_layers * self._layer_params(True, experts)
                  + (self.layers - self.sparse_layers) * self._layer_params(False, 0))
        return layers + self.vocab * self.hidden * (1 if self.tied else 2) + self.hidden + self.vision_params

    @property
    def params(self) -> int:
        return self._params(self.experts)

    @property
    def active_params(self) -> int:
        """The parameters one token's forward uses: a mixture of experts' top_k experts per layer, not all."""
        return self._params(self.top_k)

    @property
    def mlp_width(self) -> int:
        """The width of the MLP activations one token keeps: its top_k experts' together for an MoE."""
        return self.top_k * self.expert_intermediate if self.experts else self.intermediate

    def saved_bytes_per_token(self, compute_bytes: int) -> float:
        """Bytes one decoder layer keeps for the backward pass per token, as rlplat's FSDP engine runs it
        (Hugging Face's layer with SDPA attention, rlplat's gated MLP), counted with saved-tensor hooks
        (docs/plan.md): 8 hidden-size tensors (each RMSNorm's input, normalised value and output; the
        attention's query and output), key and value, the MLP's gate and up projections, one log-sum-exp
        per head and the norms' two float32 scalars. With bf16 compute each RMSNorm keeps its input as
        float32 (Hugging Face's RMSNorm computes in float32)."""
        kv = self.kv_heads * self.head_dim
        elements = 8 * self.hidden + 2 * kv + 2 * self.mlp_width
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


def _vision_params(config) -> int:
    """A vision-language model's vision encoder's parameters, counted on the model built on the meta device."""
    import torch

    from rlplat.models.vision import auto_model_class, vision_parameters

    with torch.device("meta"):
        model = auto_model_class(config).from_config(config)
    params = dict(model.named_parameters())
    return sum(params[name].numel() for name in vision_parameters(model))


def linear_shapes(shape: ModelShape) -> dict[str, tuple[int, int]]:
    """The decoder layer's linear layers (Qwen2 / Llama names) and their (input, output) widths."""
    h, q, kv, i = shape.hidden, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim, shape.intermediate
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
            "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}


def lora_params(shape: ModelShape, lora_cfg: DictConfig) -> int:
    """The LoRA adapters' parameters: r x (input + output width) for each adapted linear layer of each decoder
    layer (``model.lora.target_modules``; [] = all of them)."""
    linears = linear_shapes(shape)
    targets = list(lora_cfg.target_modules) or list(linears)
    return shape.layers * sum(lora_cfg.rank * sum(linears[name]) for name in targets if name in linears)
