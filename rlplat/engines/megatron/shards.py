"""Where one rank's Megatron tensors sit in the Hugging Face model, and the moves between the two.

A rank of a Megatron engine holds the tensors of its pipeline stage, sliced over the tensor-parallel group
(a mixture of experts' experts: shared out over the expert-parallel group) and renamed and fused by
:mod:`rlplat.engines.megatron.convert`. :class:`RankShards` knows that place and
makes the moves the engine needs beside its forward and backward: its slices of whole Hugging Face weights
(the load, the reference blend), the whole weights gathered over the ranks one unit at a time (the weight
export), and its pieces as slices of the whole tensors (checkpoints, which therefore load into any layout:
:mod:`rlplat.engines.megatron.checkpoint`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from rlplat.engines.base import blend_, check_blended
from rlplat.engines.megatron.convert import (EXPERTS, LOCAL_EXPERT, GPTShape, hf_from_megatron, hf_sources,
                                             hf_split_dim, megatron_from_hf, piece_of, stage_layers)

EMBEDDING, OUTPUT = "model.embed_tokens.weight", "lm_head.weight"  # Hugging Face names of the vocabulary-split tensors


@dataclass
class RankShards:
    """One rank's place in the model (its stage, its tensor-parallel slice) and the process groups it moves
    tensors over; built by the engine once its model exists."""

    shape: GPTShape
    tp: int
    tp_rank: int
    pp: int
    pp_rank: int
    names: list[str]  # this rank's Megatron tensors (its stage's, its tensor-parallel slices of them)
    hf_names: list[str]  # the whole model's Hugging Face weights, as exported (a tied lm_head included)
    tied_output: bool  # the output layer is the embedding
    tp_group: Any
    pp_group: Any
    device: torch.device
    ep: int = 1  # a mixture of experts: its expert-parallel size, this rank's place and group there
    ep_rank: int = 0
    ep_group: Any = None

    @property
    def first_layer(self) -> int:
        """The model's number of this stage's first decoder layer (a stage numbers its own layers from 0)."""
        return stage_layers(self.shape, self.pp, self.pp_rank).start

    def from_hf(self, hf: dict[str, torch.Tensor], names: list[str] | None = None) -> dict[str, torch.Tensor]:
        """This rank's Megatron tensors (``names``, default all) from whole Hugging Face weights: its slices of
        them, converted."""
        pieces = {name: self.piece(name, t) for name, t in hf.items()}
        return megatron_from_hf(pieces, self.shape, self.tp, self.tp_rank, self.names if names is None else names,
                                self.first_layer)

    def piece(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's piece of the whole Hugging Face tensor ``name`` (a view)."""
        return piece_of(name, tensor, self.tp, self.tp_rank, self.ep, self.ep_rank)

    def to_hf(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """This rank's Hugging Face pieces of some of its Megatron tensors (weights or optimizer moments)."""
        return hf_from_megatron(tensors, self.shape, self.tp, self.tp_rank, self.first_layer)

    def from_pieces(self, pieces: dict[str, torch.Tensor], names: list[str]) -> dict[str, torch.Tensor]:
        """The Megatron tensors ``names`` from this rank's Hugging Face pieces (what :meth:`to_hf` gave)."""
        return megatron_from_hf(pieces, self.shape, self.tp, self.tp_rank, names, self.first_layer)

    # ---------------------------------------------------------------- the weight export
    def export_units(self) -> list[tuple[int, str]]:
        """(pipeline stage, Megatron name prefix) of every export unit, in the order of the Hugging Face state
        dict; the same list on every rank. A unit nobody holds is a bug, said here rather than as a silently
        missing weight."""
        per_stage = self.shape.num_layers // self.pp
        units = [(0, "embedding."),
                 *((layer // per_stage, f"decoder.layers.{layer % per_stage}.") for layer in range(self.shape.num_layers)),
                 (self.pp - 1, "decoder.final_layernorm."), (self.pp - 1, "output_layer.")]
        mine = tuple(prefix for stage, prefix in units if stage == self.pp_rank)
        if missed := [name for name in self.names if not name.startswith(mine)]:
            raise RuntimeError(f"export_weights: no export unit holds the Megatron tensors {missed[:4]}")
        return units

    def export_buckets(self, state: dict[str, torch.Tensor], dtype: torch.dtype | None, bucket_bytes: int, context):
        """The Hugging Face weights one unit at a time (the embedding, each decoder layer, the final norm with the
        output layer): the stage that holds a unit gathers its tensor-parallel shards on the device, converts and
        casts them, and broadcasts them to the other stages (:meth:`gather_unit`, inside ``context()``); buckets of
        whole units of at most ``bucket_bytes`` (or one unit, when larger) are yielded. Beside its own shard a rank
        holds the bucket being filled and the unit being gathered, never the whole model."""
        bucket, size = [], 0
        for stage, prefix in self.export_units():
            with context():
                unit = self.gather_unit(state, stage, prefix, dtype)
            nbytes = sum(t.numel() * t.element_size() for name, t in unit if name != OUTPUT
                         or not self.tied_output)  # a tied output layer is the embedding: no more bytes
            if bucket and size + nbytes > bucket_bytes:
                yield bucket
                bucket, size = [], 0
            bucket += unit
            size += nbytes
            del unit
        if bucket:
            yield bucket

    def gather_unit(self, state: dict[str, torch.Tensor], stage: int, prefix: str,
                    dtype: torch.dtype | None) -> list[tuple[str, torch.Tensor]]:
        """The Hugging Face tensors of the Megatron tensors named ``prefix...`` on pipeline stage ``stage`` (whose
        ``state`` this rank passes when it is that stage), whole and cast to ``dtype`` on this device, on every
        rank (collective over the tensor-parallel group of that stage, then over the pipeline stages)."""
        unit: list[tuple[str, torch.Tensor]] = []
        if self.pp_rank == stage:
            held = [name for name in self.names if name.startswith(prefix)]
            unit += self._gather_experts(state, [name for name in held if LOCAL_EXPERT in name], dtype)
            for name in (name for name in held if LOCAL_EXPERT not in name):  # one tensor's pieces at a time
                pieces = [state[name]]
                if self.tp > 1:
                    pieces = [torch.empty_like(state[name]) for _ in range(self.tp)]
                    dist.all_gather(pieces, state[name].contiguous(), group=self.tp_group)
                hf_ranks = [hf_from_megatron({name: piece}, self.shape, self.tp, rank, self.first_layer)
                            for rank, piece in enumerate(pieces)]
                for hf_name, tensor in hf_ranks[0].items():
                    if (dim := hf_split_dim(hf_name)) is not None and self.tp > 1:
                        tensor = torch.cat([r[hf_name] for r in hf_ranks], dim)
                    unit.append((hf_name, tensor.to(dtype) if dtype is not None else tensor))
        if self.pp > 1:
            unit = self._broadcast_unit(unit, stage)
        if prefix == "embedding." and OUTPUT in self.hf_names and self.tied_output:
            unit.append((OUTPUT, unit[0][1]))  # the output layer is the embedding, as HF lists it
        return unit

    def _gather_experts(self, state: dict[str, torch.Tensor], names: list[str],
                        dtype: torch.dtype | None) -> list[tuple[str, torch.Tensor]]:
        """A layer's fused expert tensors, whole (each rank's local experts, gathered over the expert-parallel
        group)."""
        out = []
        for hf_name, piece in hf_from_megatron({name: state[name] for name in names}, self.shape, self.tp,
                                               self.tp_rank, self.first_layer).items():
            if self.ep > 1:
                pieces = [torch.empty_like(piece) for _ in range(self.ep)]
                dist.all_gather(pieces, piece, group=self.ep_group)
                piece = torch.cat(pieces)
            out.append((hf_name, piece.to(dtype) if dtype is not None else piece))
        return out

    def _broadcast_unit(self, unit: list[tuple[str, torch.Tensor]], stage: int) -> list[tuple[str, torch.Tensor]]:
        """``unit`` (held by pipeline stage ``stage``) on every stage: its names, shapes and dtypes, then each
        tensor, broadcast over the pipeline group."""
        src = dist.get_global_rank(self.pp_group, stage)
        meta = [[(name, tuple(t.shape), t.dtype) for name, t in unit]]
        dist.broadcast_object_list(meta, src=src, group=self.pp_group, device=self.device)
        if self.pp_rank != stage:
            unit = [(name, torch.empty(shape, dtype=dtype, device=self.device)) for name, shape, dtype in meta[0]]
        for _, tensor in unit:
            dist.broadcast(tensor.contiguous() if self.pp_rank == stage else tensor, src=src, group=self.pp_group)
        return unit

    # ---------------------------------------------------------------- the reference blend
    def blend(self, state: dict[str, torch.Tensor], buckets, alpha: float) -> None:
        """Blend each of this rank's Megatron tensors in ``state`` as soon as the Hugging Face weights it is built
        from have arrived (:func:`hf_sources`), keeping only this rank's tensor-parallel slices of them and only
        until then: beside its own shard a rank holds about one bucket (the conversion only moves and slices,
        so it commutes with the blend)."""
        waiting = hf_sources(self.names, self.hf_names, self.shape, self.first_layer)
        needed = set().union(*waiting.values())  # the Hugging Face weights a waiting tensor is built from
        pending, given = {}, set()
        with torch.no_grad():
            for bucket in buckets:
                for name, tensor in bucket:
                    given.add(name)
                    if name in needed:
                        piece = self.piece(name, tensor)
                        pending[name] = piece if piece is tensor else piece.clone()  # not a view of the whole
                ready = [name for name, sources in waiting.items() if sources <= pending.keys()]
                for name, tensor in self.from_pieces(pending, ready).items():
                    blend_(state[name], tensor.to(self.device), alpha)
                    del waiting[name]
                needed = set().union(*waiting.values())
                pending = {name: piece for name, piece in pending.items() if name in needed}
        check_blended(given, self.hf_names)
        if waiting:
            raise RuntimeError(f"blend_weights: no Hugging Face weights were converted into {sorted(waiting)[:4]}")

    # ---------------------------------------------------------------- checkpoints
    def checkpoint_pieces(self, tensors: dict[str, torch.Tensor]) -> dict:
        """:meth:`to_hf` of ``tensors``, each piece as the DTensor of its whole Hugging Face tensor over the
        tensor-parallel group (an expert tensor: over the expert-parallel group; replicated ones as they are:
        every rank holding one writes the same tensor, which the checkpoint keeps once). On the last stage of a
        tied model the output layer's copy is written as the embedding it equals (written twice, kept once, and
        read back into the copy)."""
        pieces = self.to_hf(tensors)
        if self.tied_output and "output_layer.weight" in tensors and "embedding.word_embeddings.weight" not in tensors:
            pieces.update(self.to_hf({"embedding.word_embeddings.weight": tensors["output_layer.weight"]}))
        if self.tp == 1 and self.ep == 1:
            return pieces
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.tensor import DTensor, Shard

        meshes = {}
        out = {}
        for name, piece in pieces.items():
            over, size, dim = ("ep", self.ep, 0) if EXPERTS in name else ("tp", self.tp, hf_split_dim(name))
            if dim is None or size == 1:
                out[name] = piece
                continue
            if over not in meshes:
                meshes[over] = DeviceMesh.from_group(self.ep_group if over == "ep" else self.tp_group, self.device.type)
            whole = list(piece.shape)
            whole[dim] = self.shape.vocab_size if name in (EMBEDDING, OUTPUT) else piece.shape[dim] * size
            out[name] = DTensor.from_local(piece.contiguous(), meshes[over], [Shard(dim)], run_check=False,
                                           shape=torch.Size(whole), stride=torch.empty(whole, device="meta").stride())
        return out

    def read_pieces(self, pieces: dict, names: list[str]) -> dict[str, torch.Tensor]:
        """The Megatron tensors ``names`` from what a checkpoint load filled into :meth:`checkpoint_pieces`."""
        from torch.distributed.tensor import DTensor

        return self.from_pieces({name: t.to_local() if isinstance(t, DTensor) else t for name, t in pieces.items()},
                                names)
