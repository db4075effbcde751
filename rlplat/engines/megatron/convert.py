"""Hugging Face (Qwen2 / Llama family) <-> Megatron-Core ``GPTModel`` weights, split over tensor-parallel
ranks, as pure functions of state dicts.

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
=================================================  ======================================================

Pipeline parallelism then splits each tensor-parallel shard by layers (:func:`to_stage`): stage s of pp
holds layers ``[s L / pp, (s + 1) L / pp)`` renumbered from 0, the first stage the embedding, the last the
final norm and the output layer, which with tied embeddings is a copy of the embedding (Megatron-Core
keeps the copies equal by summing their gradients).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

Tensors = Mapping[str, torch.Tensor]


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

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_hf_config(cls, config) -> GPTShape:
        return cls(config.num_hidden_layers, config.hidden_size, config.num_attention_heads,
                   getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
                   config.intermediate_size, config.vocab_size, bool(config.tie_word_embeddings))

    def padded_vocab_size(self, tp: int) -> int:
        """The vocabulary rounded up to a multiple of ``tp`` (Megatron splits it evenly)."""
        return -(-self.vocab_size // tp) * tp

    def check_tp(self, tp: int) -> None:
        if self.num_kv_heads % tp or self.num_heads % tp:
            raise ValueError(f"tensor parallel size {tp} must divide the {self.num_heads} attention heads and the "
                             f"{self.num_kv_heads} key/value heads")
        if self.intermediate_size % tp:
            raise ValueError(f"tensor parallel size {tp} must divide the MLP width {self.intermediate_size}")


def data_parallel_size(world: int, tp: int, pp: int, shape: GPTShape | None = None) -> int:
    """``world / (tp x pp)`` after checking that the sizes fit ``world`` workers and the model (when its
    ``shape`` is known)."""
    if tp < 1 or pp < 1 or world % (tp * pp):
        raise ValueError(f"tensor x pipeline parallel sizes {tp} x {pp} must divide the {world} workers "
                         f"(the data-parallel size is what is left)")
    if shape is not None:
        shape.check_tp(tp)
        if shape.num_layers % pp:
            raise ValueError(f"pipeline parallel size {pp} must divide the {shape.num_layers} layers")
    return world // (tp * pp)


def _fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: GPTShape) -> torch.Tensor:
    """``[q; k; v]`` rows regrouped per query group: ``[groups x (heads_per_group + 2) x head_dim, ...]``."""
    per_group = [t.reshape(shape.num_kv_heads, -1, *t.shape[1:]) for t in (q, k, v)]
    return torch.cat(per_group, dim=1).reshape(-1, *q.shape[1:])


def _split_qkv(qkv: torch.Tensor, shape: GPTShape) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    groups, d = shape.num_kv_heads, shape.head_dim
    q_rows = shape.num_heads // groups * d
    grouped = qkv.reshape(groups, q_rows + 2 * d, *qkv.shape[1:])
    q, k, v = grouped.split([q_rows, d, d], dim=1)
    return tuple(t.reshape(-1, *qkv.shape[1:]) for t in (q, k, v))


def _pad_rows(weight: torch.Tensor, rows: int) -> torch.Tensor:
    if rows == len(weight):
        return weight
    return torch.cat([weight, weight.new_zeros(rows - len(weight), *weight.shape[1:])])


def hf_to_megatron(hf: Tensors, shape: GPTShape, tp: int = 1) -> list[dict[str, torch.Tensor]]:
    """One Megatron state dict per tensor-parallel rank from a Hugging Face state dict."""
    shape.check_tp(tp)
    vocab = shape.padded_vocab_size(tp)
    shards: list[dict[str, torch.Tensor]] = [{} for _ in range(tp)]

    def put(name: str, tensor: torch.Tensor, dim: int | None) -> None:
        pieces = [tensor] * tp if dim is None else tensor.chunk(tp, dim=dim)
        for shard, piece in zip(shards, pieces):
            shard[name] = piece.clone()

    put("embedding.word_embeddings.weight", _pad_rows(hf["model.embed_tokens.weight"], vocab), 0)
    if "score.weight" in hf:  # a value model (AutoModelForTokenClassification, 1 label): its own head
        for kind in ("weight", "bias"):
            if f"score.{kind}" in hf:
                put(f"output_layer.{kind}", hf[f"score.{kind}"], None)
    elif not shape.tied_embeddings:
        put("output_layer.weight", _pad_rows(hf["lm_head.weight"], vocab), 0)
    put("decoder.final_layernorm.weight", hf["model.norm.weight"], None)
    for i in range(shape.num_layers):
        src, dst = f"model.layers.{i}.", f"decoder.layers.{i}."
        for kind in ("weight", "bias"):
            if f"{src}self_attn.q_proj.{kind}" in hf:
                q, k, v = (hf[f"{src}self_attn.{p}_proj.{kind}"] for p in "qkv")
                put(f"{dst}self_attention.linear_qkv.{kind}", _fuse_qkv(q, k, v, shape), 0)
        put(f"{dst}self_attention.linear_proj.weight", hf[f"{src}self_attn.o_proj.weight"], 1)
        gate, up = hf[f"{src}mlp.gate_proj.weight"].chunk(tp), hf[f"{src}mlp.up_proj.weight"].chunk(tp)
        for shard, g, u in zip(shards, gate, up):
            shard[f"{dst}mlp.linear_fc1.weight"] = torch.cat([g, u])
        put(f"{dst}mlp.linear_fc2.weight", hf[f"{src}mlp.down_proj.weight"], 1)
        put(f"{dst}input_layernorm.weight", hf[f"{src}input_layernorm.weight"], None)
        put(f"{dst}pre_mlp_layernorm.weight", hf[f"{src}post_attention_layernorm.weight"], None)
    return shards


def _value_head(shard: Tensors) -> bool:
    """A value model's head (one output) sits where a language model's output layer would."""
    weight = shard.get("output_layer.weight")
    return weight is not None and weight.shape[0] == 1


def stage_layers(shape: GPTShape, pp: int, stage: int) -> range:
    """The (global) layers pipeline stage ``stage`` of ``pp`` holds."""
    per_stage = shape.num_layers // pp
    return range(stage * per_stage, (stage + 1) * per_stage)


def to_stage(shard: Tensors, shape: GPTShape, pp: int, stage: int) -> dict[str, torch.Tensor]:
    """Pipeline stage ``stage``'s part of one tensor-parallel shard (from :func:`hf_to_megatron`), under
    the stage's own names (layers numbered from 0)."""
    layers = stage_layers(shape, pp, stage)
    first, last = stage == 0, stage == pp - 1
    out = {}
    for name, tensor in shard.items():
        if name.startswith("decoder.layers."):
            index, rest = name[len("decoder.layers."):].split(".", 1)
            if int(index) in layers:
                out[f"decoder.layers.{int(index) - layers.start}.{rest}"] = tensor
        elif name.startswith("embedding.") and first or not name.startswith("embedding.") and last:
            out[name] = tensor
    if last and not first and shape.tied_embeddings and "output_layer.weight" not in shard:  # its tied copy
        out["output_layer.weight"] = shard["embedding.word_embeddings.weight"]
    return out


def from_stages(stages: Sequence[Tensors], shape: GPTShape) -> dict[str, torch.Tensor]:
    """One tensor-parallel shard from every pipeline stage's part (the inverse of :func:`to_stage`; a
    tied output layer's copy is dropped)."""
    pp = len(stages)
    out = {}
    for stage, part in enumerate(stages):
        start = stage_layers(shape, pp, stage).start
        for name, tensor in part.items():
            if name.startswith("decoder.layers."):
                index, rest = name[len("decoder.layers."):].split(".", 1)
                out[f"decoder.layers.{int(index) + start}.{rest}"] = tensor
            elif not (name == "output_layer.weight" and shape.tied_embeddings and not _value_head(part)):
                out[name] = tensor
    return out


def megatron_to_hf(shards: Sequence[Tensors], shape: GPTShape) -> dict[str, torch.Tensor]:
    """The Hugging Face state dict from every tensor-parallel rank's Megatron state dict (the inverse of
    :func:`hf_to_megatron`; vocabulary padding is dropped)."""
    def joined(name: str, dim: int) -> torch.Tensor:
        return torch.cat([shard[name] for shard in shards], dim=dim)

    def replicated(name: str) -> torch.Tensor:
        return shards[0][name]

    hf = {"model.embed_tokens.weight": joined("embedding.word_embeddings.weight", 0)[: shape.vocab_size],
          "model.norm.weight": replicated("decoder.final_layernorm.weight")}
    if _value_head(shards[0]):
        hf.update({f"score.{kind}": replicated(f"output_layer.{kind}") for kind in ("weight", "bias")
                   if f"output_layer.{kind}" in shards[0]})
    elif not shape.tied_embeddings:
        hf["lm_head.weight"] = joined("output_layer.weight", 0)[: shape.vocab_size]
    for i in range(shape.num_layers):
        src, dst = f"decoder.layers.{i}.", f"model.layers.{i}."
        for kind in ("weight", "bias"):
            if f"{src}self_attention.linear_qkv.{kind}" in shards[0]:
                q, k, v = _split_qkv(joined(f"{src}self_attention.linear_qkv.{kind}", 0), shape)
                hf.update({f"{dst}self_attn.q_proj.{kind}": q, f"{dst}self_attn.k_proj.{kind}": k,
                           f"{dst}self_attn.v_proj.{kind}": v})
        hf[f"{dst}self_attn.o_proj.weight"] = joined(f"{src}self_attention.linear_proj.weight", 1)
        gate_up = [shard[f"{src}mlp.linear_fc1.weight"].chunk(2) for shard in shards]
        hf[f"{dst}mlp.gate_proj.weight"] = torch.cat([g for g, _ in gate_up])
        hf[f"{dst}mlp.up_proj.weight"] = torch.cat([u for _, u in gate_up])
        hf[f"{dst}mlp.down_proj.weight"] = joined(f"{src}mlp.linear_fc2.weight", 1)
        hf[f"{dst}input_layernorm.weight"] = replicated(f"{src}input_layernorm.weight")
        hf[f"{dst}post_attention_layernorm.weight"] = replicated(f"{src}pre_mlp_layernorm.weight")
    return hf
