"""Hugging Face (Qwen2 / Qwen3 / Llama family, Qwen3-MoE) <-> Megatron-Core ``GPTModel`` weights, split over
tensor-parallel (and expert-parallel) ranks, as pure functions of state dicts.

Megatron-Bridge (``AutoBridge``) does this conversion upstream, but it pins ``transformers<5`` and needs
TransformerEngine, mamba-ssm and causal-conv1d (CUDA builds), so it cannot be installed next to rlplat's
stack or on a CPU machine; these functions cover the dense decoder layout rlplat trains.

The layout (Megatron-Core's local and TransformerEngine layer specs name the weights the same way):

=================================================  ======================================================
Hugging Face (per layer ``model.layers.i.``)       Megatron (per layer ``decoder.layers.i.``), TP split
=================================================  ======================================================
``self_attn.{q,k,v}_proj.{weight,bias}``           ``self_attention.linear_qkv.{weight,bias}``: per query
                                                   group g: [the q heads of g; k_g; v_g], then the groups;
                                                   column-parallel: each rank holds num_kv_heads / tp groups
``self_attn.o_proj.weight``                        ``self_attention.linear_proj.weight``, row-parallel (dim 1)
``mlp.{gate,up}_proj.weight``                      ``mlp.linear_fc1.weight`` = [gate; up]; each rank holds
                                                   [its gate rows; its up rows]
``mlp.down_proj.weight``                           ``mlp.linear_fc2.weight``, row-parallel (dim 1)
``input_layernorm`` / ``post_attention_layernorm`` ``input_layernorm`` / ``pre_mlp_layernorm``, replicated
``model.embed_tokens.weight`` / ``lm_head.weight`` ``embedding.word_embeddings.weight`` /
                                                   ``output_layer.weight``: vocab rows padded with zeros to
                                                   a multiple of tp, then split (dim 0)
``model.norm.weight``                              ``decoder.final_layernorm.weight``, replicated
``score.{weight,bias}`` (a value model's head)     ``output_layer.{weight,bias}``, replicated (1 output)
``self_attn.{q,k}_norm.weight`` (Qwen3)            ``self_attention.{q,k}_layernorm.weight``, replicated
``mlp.gate.weight`` (a sparse layer's router)      ``mlp.router.weight``, replicated
``mlp.experts.gate_up_proj`` ``[E, 2I, H]``        ``mlp.experts.local_experts.j.linear_fc1.weight`` = expert
                                                   ``e``'s ``[gate; up]``; expert-parallel rank r holds the
                                                   experts ``e = r E / ep + j``, each whole (expert tensor
                                                   parallel size 1)
``mlp.experts.down_proj`` ``[E, H, I]``            ``mlp.experts.local_experts.j.linear_fc2.weight``, as above
=================================================  ======================================================

A mixture of experts (Qwen3-MoE: ``num_experts`` routed experts in each sparse layer, no shared expert) keeps its
experts fused as transformers 5 holds them; an expert-parallel rank's piece of ``gate_up_proj`` / ``down_proj`` is
its experts' rows (:func:`piece_of`), and its local experts are those rows in order.

Each tensor-parallel rank's Megatron tensors are a function of its slices of the Hugging Face tensors
(:func:`tp_slice` along :func:`hf_split_dim`) and the other way round (:func:`megatron_from_hf`,
:func:`hf_from_megatron`): the engine converts its own shard without gathering, and a checkpoint stores
the slices under Hugging Face names. Pipeline parallelism splits by layers: stage s of pp holds layers
``[s L / pp, (s + 1) L / pp)`` numbered from 0 (``first_layer`` gives the offset), the first stage the
embedding, the last the final norm and the output layer, which with tied embeddings is a copy of the
embedding (Megatron-Core keeps the copies equal by summing their gradients).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from rlplat.models.moe import num_experts, sparse_layers

Tensors = Mapping[str, torch.Tensor]
QK_NORM_MODELS = ("qwen3", "qwen3_moe")  # model types whose attention normalises each head's queries and keys
EXPERTS = ".mlp.experts."  # in the name of a Hugging Face expert tensor (fused over the experts)


@dataclass(frozen=True)
class GPTShape:
    """What the conversion needs to know of the architecture."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    tied_embeddings: bool
    explicit_head_dim: int = 0  # a config's head_dim when it says one (Qwen3); else hidden_size / num_heads
    qk_norm: bool = False  # RMSNorm of each head's queries and keys (Qwen3)
    # a mixture of experts: routed experts per sparse layer, experts per token, one expert's MLP width, which layers
    # are sparse (the others have a dense MLP), and whether the chosen experts' gates are renormalised over them
    num_experts: int = 0
    top_k: int = 0
    moe_intermediate_size: int = 0
    sparse_layers: tuple[int, ...] = ()
    norm_topk_prob: bool = True

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden_size // self.num_heads

    @classmethod
    def from_hf_config(cls, config) -> GPTShape:
        """The shape of a Hugging Face config (or of an embedded model's spec, whose vocabulary is not known: 0)."""
        experts = num_experts(config)
        return cls(config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
                   getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
                   getattr(config, "intermediate_size", 0), getattr(config, "vocab_size", 0),
                   bool(config.tie_word_embeddings), getattr(config, "head_dim", None) or 0,
                   getattr(config, "model_type", None) in QK_NORM_MODELS,
                   experts, getattr(config, "num_experts_per_tok", 0) if experts else 0,
                   getattr(config, "moe_intermediate_size", 0) if experts else 0, sparse_layers(config),
                   bool(getattr(config, "norm_topk_prob", True)))

    def padded_vocab_size(self, tp: int) -> int:
        """The vocabulary rounded up to a multiple of ``tp`` (Megatron splits it evenly)."""
        return -(-self.vocab_size // tp) * tp

    def check_tp(self, tp: int) -> None:
        if self.num_kv_heads % tp or self.num_heads % tp:
            raise ValueError(f"tensor parallel size {tp} must divide the {self.num_heads} attention heads and the "
                             f"{self.num_kv_heads} key/value heads")
        if self.intermediate_size % tp and len(self.sparse_layers) < self.num_layers:
            raise ValueError(f"tensor parallel size {tp} must divide the MLP width {self.intermediate_size}")

    def check_ep(self, ep: int) -> None:
        if ep < 1 or (self.num_experts or 1) % ep:
            raise ValueError(f"expert parallel size {ep} must divide the {self.num_experts or 1} experts of each "
                             f"sparse layer" + ("" if self.num_experts else " (a dense model has none: use 1)"))


def data_parallel_size(world: int, tp: int, pp: int, shape: GPTShape | None = None, ep: int = 1) -> int:
    """``world / (tp x pp)`` after checking that the sizes fit ``world`` workers and the model (when its
    ``shape`` is known). The experts' ranks fold over the same workers: ``ep`` must divide ``world / pp`` (an
    expert-parallel group is drawn from the tensor- and data-parallel ranks of a stage)."""
    if tp < 1 or pp < 1 or world % (tp * pp):
        raise ValueError(f"tensor x pipeline parallel sizes {tp} x {pp} must divide the {world} workers "
                         f"(the data-parallel size is what is left)")
    if ep < 1 or (world // pp) % ep:
        raise ValueError(f"expert parallel size {ep} must divide the {world // pp} workers of a pipeline stage")
    if shape is not None:
        shape.check_tp(tp)
        shape.check_ep(ep)
        if shape.num_layers % pp:
            raise ValueError(f"pipeline parallel size {pp} must divide the {shape.num_layers} layers")
    return world // (tp * pp)


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: GPTShape) -> torch.Tensor:
    """``[q; k; v]`` rows regrouped per query group: ``[groups x (heads_per_group + 2) x head_dim, ...]``
    (all groups, or one tensor-parallel rank's)."""
    groups = len(k) // shape.head_dim
    per_group = [t.reshape(groups, -1, *t.shape[1:]) for t in (q, k, v)]
    return torch.cat(per_group, dim=1).reshape(-1, *q.shape[1:])


def _split_qkv(qkv: torch.Tensor, shape: GPTShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    d = shape.head_dim
    q_rows = shape.num_heads // shape.num_kv_heads * d
    grouped = qkv.reshape(-1, q_rows + 2 * d, *qkv.shape[1:])
    q, k, v = grouped.split([q_rows, d, d], dim=1)
    return tuple(t.reshape(-1, *qkv.shape[1:]) for t in (q, k, v))


def _pad_rows(weight: torch.Tensor, rows: int) -> torch.Tensor:
    if rows == len(weight):
        return weight
    return torch.cat([weight, weight.new_zeros(rows - len(weight), *weight.shape[1:])])


def hf_split_dim(name: str) -> int | None:
    """The dimension of the Hugging Face tensor ``name`` that tensor parallelism splits (None: every rank
    holds it whole; an expert's weights are split over the experts instead: :func:`piece_of`)."""
    if EXPERTS in name:
        return None
    if name.endswith(("_proj.weight", "_proj.bias", "embed_tokens.weight", "lm_head.weight")):
        return 1 if name.endswith(("o_proj.weight", "down_proj.weight")) else 0
    return None


def tp_slice(tensor: torch.Tensor, dim: int | None, tp: int, rank: int) -> torch.Tensor:
    """Tensor-parallel rank ``rank``'s slice of ``tensor`` along ``dim`` (a view): ``ceil(n / tp)`` entries per
    rank, the last ranks' shorter or empty when tp does not divide n (only the vocabulary; Megatron pads it,
    :func:`megatron_from_hf`). This is torch's ``Shard(dim)`` layout, so a checkpoint stores it as is."""
    if dim is None or tp == 1:
        return tensor
    n = tensor.shape[dim]
    start = min(rank * -(-n // tp), n)
    return tensor.narrow(dim, start, min(n, start + -(-n // tp)) - start)


def piece_of(name: str, tensor: torch.Tensor, tp: int, tp_rank: int, ep: int = 1, ep_rank: int = 0) -> torch.Tensor:
    """A rank's piece of the Hugging Face tensor ``name`` (a view): the experts of its expert-parallel rank for an
    expert tensor, else its tensor-parallel slice (:func:`tp_slice` along :func:`hf_split_dim`)."""
    if EXPERTS in name:
        return tp_slice(tensor, 0, ep, ep_rank)
    return tp_slice(tensor, hf_split_dim(name), tp, tp_rank)


# per layer, Megatron name -> Hugging Face name, for the weights that are only renamed
_LAYER_RENAMES = {"self_attention.linear_proj.weight": "self_attn.o_proj.weight",
                  "mlp.linear_fc2.weight": "mlp.down_proj.weight",
                  "input_layernorm.weight": "input_layernorm.weight",
                  "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
                  "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
                  "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
                  "mlp.router.weight": "mlp.gate.weight"}
LOCAL_EXPERT = "mlp.experts.local_experts."  # a Megatron layer's local expert j: LOCAL_EXPERT + "j.linear_fc1.weight"
_EXPERT_TENSORS = {"linear_fc1.weight": "mlp.experts.gate_up_proj", "linear_fc2.weight": "mlp.experts.down_proj"}


def _local_expert(rest: str) -> tuple[int, str] | None:
    """``mlp.experts.local_experts.j.linear_fc1.weight`` -> (j, the fused Hugging Face tensor's name in the layer)."""
    if not rest.startswith(LOCAL_EXPERT):
        return None
    index, kind = rest[len(LOCAL_EXPERT):].split(".", 1)
    return int(index), _EXPERT_TENSORS[kind]


def _layer(name: str, first_layer: int) -> tuple[str, str]:
    """``decoder.layers.i.rest`` -> (``model.layers.{i + first_layer}.``, ``rest``)."""
    index, rest = name[len("decoder.layers."):].split(".", 1)
    return f"model.layers.{int(index) + first_layer}.", rest


def megatron_from_hf(pieces: Tensors, shape: GPTShape, tp: int, rank: int, names: Iterable[str],
                     first_layer: int = 0) -> dict[str, torch.Tensor]:
    """The Megatron tensors ``names`` of tensor-parallel rank ``rank``, from that rank's Hugging Face pieces
    (:func:`tp_slice` of each tensor along :func:`hf_split_dim`). ``names`` are a pipeline stage's own
    (layers numbered from 0; the stage's first layer is ``first_layer``); with tied embeddings the last
    stage's output layer is the embedding."""
    rows = shape.padded_vocab_size(tp) // tp

    def build(name: str) -> torch.Tensor:
        if name == "embedding.word_embeddings.weight":
            return _pad_rows(pieces["model.embed_tokens.weight"], rows)
        if name.startswith("output_layer."):
            if "score.weight" in pieces:  # a value model (AutoModelForTokenClassification, 1 label): its head
                return pieces[f"score.{name.split('.')[1]}"]
            return _pad_rows(pieces["model.embed_tokens.weight" if shape.tied_embeddings else "lm_head.weight"], rows)
        if name == "decoder.final_layernorm.weight":
            return pieces["model.norm.weight"]
        dst, rest = _layer(name, first_layer)
        if rest in _LAYER_RENAMES:
            return pieces[dst + _LAYER_RENAMES[rest]]
        if rest.startswith("self_attention.linear_qkv."):
            kind = rest.rsplit(".", 1)[1]
            return _fuse_qkv(*(pieces[f"{dst}self_attn.{p}_proj.{kind}"] for p in "qkv"), shape)
        if rest == "mlp.linear_fc1.weight":  # each rank: [its gate rows; its up rows]
            return torch.cat([pieces[f"{dst}mlp.gate_proj.weight"], pieces[f"{dst}mlp.up_proj.weight"]])
        if (expert := _local_expert(rest)) is not None:  # a row of this rank's piece: its experts
            return pieces[dst + expert[1]][expert[0]]
        raise ValueError(f"no Hugging Face weight maps to Megatron's {name}")

    out = {}
    for name in names:
        try:
            out[name] = build(name)
        except KeyError as missing:
            raise ValueError(f"Megatron's {name} needs the Hugging Face weight {missing.args[0]}, which is missing") \
                from None
    return out


def hf_from_megatron(shard: Tensors, shape: GPTShape, tp: int, rank: int, first_layer: int = 0) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s Hugging Face pieces (see :func:`megatron_from_hf`, which this inverts) of the Megatron
    tensors in ``shard`` (a whole stage's, or any of them: e.g. the optimizer state of some): vocabulary
    padding is dropped, and so is a tied output layer's copy of the embedding."""
    real_rows = lambda t: t[: max(0, min(len(t), shape.vocab_size - rank * len(t)))]  # noqa: E731
    out, experts = {}, {}
    for name, tensor in shard.items():
        if name == "embedding.word_embeddings.weight":
            out["model.embed_tokens.weight"] = real_rows(tensor)
        elif name.startswith("output_layer."):
            if tensor.shape[0] == 1:  # a value model's one-output head
                out[f"score.{name.split('.')[1]}"] = tensor
            elif not shape.tied_embeddings:
                out["lm_head.weight"] = real_rows(tensor)
        elif name == "decoder.final_layernorm.weight":
            out["model.norm.weight"] = tensor
        else:
            dst, rest = _layer(name, first_layer)
            if rest in _LAYER_RENAMES:
                out[dst + _LAYER_RENAMES[rest]] = tensor
            elif rest.startswith("self_attention.linear_qkv."):
                kind = rest.rsplit(".", 1)[1]
                out.update(zip((f"{dst}self_attn.{p}_proj.{kind}" for p in "qkv"), _split_qkv(tensor, shape)))
            elif rest == "mlp.linear_fc1.weight":
                gate, up = tensor.chunk(2)
                out.update({f"{dst}mlp.gate_proj.weight": gate, f"{dst}mlp.up_proj.weight": up})
            elif (expert := _local_expert(rest)) is not None:
                experts.setdefault(dst + expert[1], {})[expert[0]] = tensor
            else:
                raise ValueError(f"Megatron's {name} has no Hugging Face name")
    for name, local in experts.items():  # this rank's piece: its local experts stacked in order
        if sorted(local) != list(range(len(local))) or (shape.num_experts and shape.num_experts % len(local)):
            raise ValueError(f"{name}: a rank's piece needs all of its local experts, got {sorted(local)}")
        out[name] = torch.stack([local[j] for j in range(len(local))])
    return out


def megatron_name(name: str) -> str:
    """The Megatron tensor that holds the Hugging Face weight ``name`` (or a part of it; an expert tensor's rows are
    every local expert's, named with ``*`` for the expert); ValueError for a weight the layout does not have."""
    top = {"model.embed_tokens.weight": "embedding.word_embeddings.weight", "lm_head.weight": "output_layer.weight",
           "model.norm.weight": "decoder.final_layernorm.weight", "score.weight": "output_layer.weight",
           "score.bias": "output_layer.bias"}
    if name in top:
        return top[name]
    if not name.startswith("model.layers.") or name.count(".") < 4:
        raise ValueError(f"{name} has no place in a Qwen2 / Qwen3 / Llama model or a Qwen3-MoE")
    index, rest = name[len("model.layers."):].split(".", 1)
    if rest.startswith(("self_attn.q_proj.", "self_attn.k_proj.", "self_attn.v_proj.")):
        rest = "self_attention.linear_qkv." + rest.rsplit(".", 1)[1]
    elif rest in ("mlp.gate_proj.weight", "mlp.up_proj.weight"):
        rest = "mlp.linear_fc1.weight"
    elif rest in _EXPERT_TENSORS.values():
        rest = LOCAL_EXPERT + "*." + next(mg for mg, hf in _EXPERT_TENSORS.items() if hf == rest)
    elif rest in _LAYER_RENAMES.values():
        rest = next(mg for mg, hf in _LAYER_RENAMES.items() if hf == rest)
    else:
        raise ValueError(f"{name} has no place in a Qwen2 / Qwen3 / Llama model or a Qwen3-MoE")
    return f"decoder.layers.{index}.{rest}"


def hf_sources(names: Iterable[str], hf_names: Iterable[str], shape: GPTShape,
               first_layer: int = 0) -> dict[str, set[str]]:
    """The Hugging Face weights (of ``hf_names``, the whole model's) that each of a pipeline stage's Megatron
    tensors ``names`` is built from by :func:`megatron_from_hf`: e.g. a layer's fused QKV from its q, k and v
    projections; with tied embeddings the last stage's output layer from the embedding."""
    hf_names = list(hf_names)
    needs: dict[str, set[str]] = {name: set() for name in names}
    tied = shape.tied_embeddings and "score.weight" not in hf_names  # a value model's head is its own
    for hf in hf_names:
        name = megatron_name(hf)
        if name.startswith("decoder.layers."):  # numbered from the stage's first layer
            index, rest = name[len("decoder.layers."):].split(".", 1)
            name = f"decoder.layers.{int(index) - first_layer}.{rest}"
        if tied and name == "output_layer.weight":
            continue  # lm_head.weight, as Hugging Face lists a tied output layer: the embedding's copy
        for target in fnmatch.filter(needs, name) if "*" in name else [name] if name in needs else []:
            needs[target].add(hf)
        if tied and hf == "model.embed_tokens.weight" and "output_layer.weight" in needs:
            needs["output_layer.weight"].add(hf)
    return needs


def stage_layers(shape: GPTShape, pp: int, stage: int) -> range:
    """The (global) layers pipeline stage ``stage`` of ``pp`` holds."""
    per_stage = shape.num_layers // pp
    return range(stage * per_stage, (stage + 1) * per_stage)
