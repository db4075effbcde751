"""A Megatron-Core ``GPTModel`` with the architecture of a Hugging Face Qwen2 / Qwen3 / Llama or Qwen3-MoE config.

Needs ``megatron-core`` (``pip install -e '.[megatron]'``) and an initialised model-parallel state
(``megatron.core.parallel_state.initialize_model_parallel``). Uses the local layer spec (plain torch
modules, SwiGLU, rotary embeddings), so TransformerEngine is optional, with rlplat's :class:`RMSNorm` in
place of the spec's torch norm, which refuses sequence parallelism.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from rlplat.engines.megatron.convert import GPTShape


def transformer_config(hf_config, params_dtype: torch.dtype = torch.float32, **parallel):
    """Megatron's ``TransformerConfig`` for ``hf_config``; ``parallel`` passes parallel sizes and switches
    (``tensor_model_parallel_size``, ``sequence_parallel``, ``recompute_granularity``, ...)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    shape = GPTShape.from_hf_config(hf_config)
    config = TransformerConfig(
        num_layers=shape.num_layers, hidden_size=shape.hidden_size, num_attention_heads=shape.num_heads,
        num_query_groups=shape.num_kv_heads, ffn_hidden_size=shape.intermediate_size or shape.moe_intermediate_size,
        kv_channels=shape.head_dim, normalization="RMSNorm", layernorm_epsilon=hf_config.rms_norm_eps,
        qk_layernorm=shape.qk_norm,
        gated_linear_unit=True, activation_func=torch.nn.functional.silu, add_bias_linear=False,
        add_qkv_bias=hf_config.model_type == "qwen2", hidden_dropout=0.0, attention_dropout=0.0,
        params_dtype=params_dtype, bf16=params_dtype == torch.bfloat16, use_cpu_initialization=True,
        # the fused kernels are CUDA-only; the plain torch paths are exact
        bias_activation_fusion=False, bias_dropout_fusion=False, masked_softmax_fusion=False,
        persist_layer_norm=False, gradient_accumulation_fusion=False, apply_rope_fusion=False,
        pipeline_dtype=params_dtype,
        **{"moe_token_dispatcher_type": "alltoall", **(moe_config(shape) if shape.num_experts else {}), **parallel},
    )
    # Pipeline stages exchange activations of each micro-batch's own shape (token budgets vary the rows): the stages
    # send each one's shape first. Set after the config's checks, which refuse it beside MoE's allgather dispatcher
    # (on CPU) though the switch changes only what the stages send each other, not the dispatcher's gathers.
    config.variable_seq_lengths = parallel.get("pipeline_model_parallel_size", 1) > 1
    return config


def moe_config(shape: GPTShape) -> dict:
    """A mixture of experts' ``TransformerConfig`` switches: its routed experts in the sparse layers (a dense MLP in
    the others), each expert whole on its expert-parallel rank (expert tensor parallel size 1), the local experts
    run one after another (``SequentialMLP``: no grouped GEMM, which needs CUDA); the tokens reach them all-to-all
    (``parallel`` of :func:`transformer_config` may choose ``moe_token_dispatcher_type=allgather``: on CPU).
    Softmax top-k routing: the chosen experts' gates are the softmax over their logits when the model renormalises
    them (Qwen3-MoE's ``norm_topk_prob``), else their share of the softmax over all experts. The load-balancing
    loss is rlplat's own (:mod:`rlplat.engines.routing`), not Megatron-Core's."""
    return dict(num_moe_experts=shape.num_experts, moe_router_topk=shape.top_k,
                moe_ffn_hidden_size=shape.moe_intermediate_size, moe_router_score_function="softmax",
                moe_router_pre_softmax=not shape.norm_topk_prob, moe_router_load_balancing_type="none",
                moe_aux_loss_coeff=0.0, moe_grouped_gemm=False, expert_tensor_parallel_size=1,
                moe_layer_freq=[int(i in shape.sparse_layers) for i in range(shape.num_layers)])


class RMSNorm(torch.nn.RMSNorm):
    """torch's RMSNorm as a layer-spec module that also runs with sequence parallelism. There each
    tensor-parallel rank normalises its own slice of the sequence, so the weight's gradient is partial: the
    weight is marked ``sequence_parallel`` (Megatron-Core's convention) and the engine sums such gradients
    over the tensor-parallel group."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **unused):
        super().__init__(hidden_size, eps=eps, dtype=config.params_dtype)
        self.weight.sequence_parallel = config.sequence_parallel


class ValueHead(torch.nn.Module):
    """A value model's head in place of ``GPTModel.output_layer``: one value per position from the final
    hidden states (which every tensor-parallel rank holds whole, so the head is replicated; with sequence
    parallelism each rank's slice of the sequence is gathered first). Called as the output layer is; the
    model returns ``[batch, seq, 1]``."""

    def __init__(self, hidden_size: int, params_dtype: torch.dtype, sequence_parallel: bool = False):
        super().__init__()
        self.sequence_parallel = sequence_parallel
        self.weight = torch.nn.Parameter(torch.zeros(1, hidden_size, dtype=params_dtype))  # loaded from the
        self.bias = torch.nn.Parameter(torch.zeros(1, dtype=params_dtype))  # Hugging Face model's score head

    def forward(self, hidden_states, weight=None, runtime_gather_output=None):
        if self.sequence_parallel:  # every rank computes the whole loss: backward keeps its own slice's gradient
            from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region

            hidden_states = gather_from_sequence_parallel_region(hidden_states, tensor_parallel_output_grad=False)
        return torch.nn.functional.linear(hidden_states, self.weight, self.bias), None


def _layer_spec(shape: GPTShape, sparse: bool):
    """The local (plain torch) spec of a decoder layer, its norms rlplat's :class:`RMSNorm`; ``sparse``: its MLP the
    routed experts."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    layer = get_gpt_layer_local_spec(num_experts=shape.num_experts if sparse else None, qk_layernorm=shape.qk_norm)
    layer.submodules.input_layernorm = layer.submodules.pre_mlp_layernorm = RMSNorm
    if shape.qk_norm:
        attention = layer.submodules.self_attention.submodules
        attention.q_layernorm = attention.k_layernorm = RMSNorm
    return layer


def build_gpt_model(hf_config, params_dtype: torch.dtype = torch.float32, pre_process: bool = True,
                    post_process: bool = True, value_head: bool = False, **parallel):
    """The (this rank's shard of the) ``GPTModel`` for ``hf_config``, randomly initialised: load weights
    with :func:`rlplat.engines.megatron.convert.megatron_from_hf` (each rank its own). ``pre_process``: this
    pipeline stage holds the embedding; ``post_process``: the final norm and the output layer, which
    ``value_head`` replaces by a :class:`ValueHead` (a critic)."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules, get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    shape = GPTShape.from_hf_config(hf_config)
    config = transformer_config(hf_config, params_dtype, **parallel)
    first = get_transformer_layer_offset(config)  # this pipeline stage's first layer
    layers = [_layer_spec(shape, first + i in shape.sparse_layers) for i in range(get_num_layers_to_build(config))]
    block = TransformerBlockSubmodules(layer_specs=layers, layer_norm=RMSNorm)
    rope = getattr(hf_config, "rope_parameters", None) or {"rope_theta": getattr(hf_config, "rope_theta", 10000.0)}
    model = GPTModel(
        config=config, transformer_layer_spec=block,
        vocab_size=shape.padded_vocab_size(config.tensor_model_parallel_size),
        max_sequence_length=hf_config.max_position_embeddings,
        share_embeddings_and_output_weights=shape.tied_embeddings and not value_head,
        position_embedding_type="rope", rotary_base=rope["rope_theta"], pre_process=pre_process,
        post_process=post_process,
    )
    if value_head and post_process:
        model.output_layer = ValueHead(shape.hidden_size, params_dtype, config.sequence_parallel)
    return model


def no_grad_at(padding_idx: int):
    """A forward hook for the word embedding: positions holding ``padding_idx`` pass no gradient to the
    embedding (the Hugging Face model's ``padding_idx`` semantics; a sampled pad token is one)."""

    def hook(module, inputs, output):
        at_pad = inputs[0] == padding_idx  # [B, T]
        if module.reduce_scatter_embeddings:  # sequence parallel: output [T / tp, B, H], this rank's slice
            at_pad = at_pad.t().chunk(dist.get_world_size(module.tp_group))[dist.get_rank(module.tp_group)]
        return torch.where(at_pad.unsqueeze(-1), output.detach(), output)

    return hook
