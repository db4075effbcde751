"""Ulysses sequence parallelism for Hugging Face decoders: one sequence split over the U ranks of a group.

DeepSpeed-Ulysses (Jacobs et al. 2023, "DeepSpeed Ulysses: System Optimizations for Enabling Training of Extreme
Long Sequence Transformer Models", arXiv:2309.14509). The U ranks of a sequence-parallel group hold the same
rows; each runs the model on a contiguous 1/U slice of the sequence dimension (:func:`local_slice`), so every
activation outside attention is 1/U of the sequence's. Attention needs the whole sequence: an all-to-all turns
the rank's queries, keys and values from all heads of its slice ``[B, H, S/U, D]`` into H/U heads of the whole
sequence ``[B, H/U, S, D]``, the rank attends over the whole sequence for those heads, and a second all-to-all
turns the output back into all heads of its slice. Both all-to-alls go through ``torch.distributed`` (gloo on
CPU, NCCL on GPU) with their gradients (the backward of an all-to-all is the reverse all-to-all).

The hook is transformers' attention-function interface: :data:`ATTENTION` is registered as an attention
implementation, and a model set to it (``model.config._attn_implementation``, that model only) calls
:func:`ulysses_attention` from every attention layer. Transformers builds no mask for an implementation it does
not know; the sequences come from the forward's :class:`SequenceShard` (:func:`sharded`): a packed row's told
apart by their position ids restarting at 0 (as :mod:`rlplat.engines.packing` lays them out), a padded row's
the span of its real tokens. Each rank attends causally within each sequence, one fused attention call per
sequence without a mask, so attention memory grows with the sequence, not its square.

Each rank's rotary embeddings are its own tokens' (the slice's position ids are the sequence's), so nothing
else in the layer changes. Query heads must divide by U; key/value heads that do not are repeated to the query
heads before the all-to-all (more bytes moved, the same result).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

ATTENTION = "rlplat_ulysses"  # the attention implementation a sequence-parallel model is set to


@dataclass
class SequenceShard:
    """This forward's sequence-parallel facts: the group, and the whole sequence's position ids ``[B, S]`` and
    attention mask ``[B, S]`` (None: packed rows, whose sequences restart their position ids at 0)."""

    group: dist.ProcessGroup
    position_ids: torch.Tensor
    attention_mask: torch.Tensor | None = None
    _segments: list[list[tuple[int, int]]] | None = field(default=None, repr=False)

    @property
    def size(self) -> int:
        return dist.get_world_size(self.group)

    @property
    def rank(self) -> int:
        return dist.get_rank(self.group)

    def segments(self) -> list[list[tuple[int, int]]]:
        """Each row's sequences as ``(start, end)`` spans (found once per forward, shared by the layers): where the
        position ids restart at 0 (packed rows), or the span of real tokens (padded rows; padding outside it)."""
        if self._segments is None:
            self._segments = []
            for row, positions in enumerate(self.position_ids.tolist()):
                if self.attention_mask is None:
                    starts = [i for i, p in enumerate(positions) if p == 0 or i == 0]
                    self._segments.append(list(zip(starts, [*starts[1:], len(positions)])))
                    continue
                real = self.attention_mask[row].nonzero().flatten().tolist()
                if real and real[-1] - real[0] + 1 != len(real):
                    raise ValueError("Ulysses attention takes padded rows whose real tokens are one run (padding "
                                     "before and after them only)")
                self._segments.append([(real[0], real[-1] + 1)] if real else [])
        return self._segments


# the forward's shard: a module global, not a context variable, because the backward pass, where gradient
# checkpointing runs the forward again, may run in autograd's own threads
_current: SequenceShard | None = None


@contextlib.contextmanager
def sharded(shard: SequenceShard) -> Iterator[SequenceShard]:
    """Inside the block (a forward, or a backward that recomputes one), a model set to :data:`ATTENTION`
    attends as ``shard`` says."""
    global _current
    previous, _current = _current, shard
    try:
        yield shard
    finally:
        _current = previous


def padded_length(length: int, size: int) -> int:
    """``length`` rounded up to a multiple of ``size``: every rank's slice has the same length."""
    return -(-length // size) * size


def local_slice(tensor: torch.Tensor, rank: int, size: int, dim: int = 1) -> torch.Tensor:
    """Rank ``rank``'s contiguous slice of ``tensor`` along ``dim`` (its length a multiple of ``size``)."""
    length = tensor.shape[dim]
    if length % size:
        raise ValueError(f"sequence length {length} does not divide by the sequence-parallel size {size}")
    return tensor.narrow(dim, rank * (length // size), length // size)


def local_tokens(flat: torch.Tensor, width: int, group: dist.ProcessGroup, fill=-1) -> torch.Tensor:
    """This rank's share of ``flat`` ``[rows * width, ...]`` (one value per token of the rows, in their order): its
    slice of each row, the rows padded with ``fill`` to a width that divides by U, flattened as the rank's model
    sees its tokens (a mixture of experts' replayed routing)."""
    rest = flat.shape[1:]
    rows = flat.reshape(-1, width, *rest)
    pad = padded_length(width, dist.get_world_size(group)) - width
    if pad:
        rows = torch.cat([rows, rows.new_full((len(rows), pad, *rest), fill)], dim=1)
    return local_slice(rows, dist.get_rank(group), dist.get_world_size(group)).reshape(-1, *rest)


def whole_tokens(local: torch.Tensor, rows: int, width: int, group: dist.ProcessGroup) -> torch.Tensor:
    """The inverse of :func:`local_tokens`: every rank's share gathered into ``[rows * width, ...]``, the same on
    every rank of the group (a mixture of experts' recorded routing). Its backward sums the group's gradients, as
    :meth:`LocalRows.combine`'s does."""
    from torch.distributed._functional_collectives import all_gather_single_autograd

    size, rest = dist.get_world_size(group), local.shape[1:]
    gathered = all_gather_single_autograd(local.contiguous(), gather_dim=0, group=group)  # [U * rows * slice, ...]
    per_rank = gathered.reshape(size, rows, -1, *rest).transpose(0, 1).reshape(rows, -1, *rest)
    return per_rank[:, :width].reshape(rows * width, *rest)


@dataclass
class LocalRows:
    """One rank's part of a micro-batch's rows ``[rows, width]``: its slice of each row (the rows padded to a
    width that divides by U) and the output positions that fall in it."""

    input_ids: torch.Tensor  # [rows, slice]
    position_ids: torch.Tensor  # [rows, slice]
    positions: torch.Tensor  # [n] flat indices into the local rows of the output positions held here
    held: torch.Tensor  # [N] bool: which of the micro-batch's N output positions those are
    shard: SequenceShard

    def combine(self, values: torch.Tensor) -> torch.Tensor:
        """This rank's outputs ``[n]`` (or ``[n, k]``: k kinds of output, gathered in one collective) -> all ``N``
        positions' (each computed by one rank), the same on every rank of the group. Its backward sums the
        group's gradients, so each rank's outputs get U times the gradient of a loss that every rank computes
        alike: the engine scales its loss by the data-parallel size, not the world size
        (:meth:`rlplat.engines.fsdp.FSDPEngine.backward`)."""
        from torch.distributed._functional_collectives import all_gather_single_autograd

        held = self.held.view(-1, *(1,) * (values.dim() - 1)).expand(-1, *values.shape[1:])
        full = values.new_zeros(held.shape).masked_scatter(held, values)
        gathered = all_gather_single_autograd(full, gather_dim=0, group=self.shard.group)
        return gathered.view(self.shard.size, *full.shape).sum(0)


def split_rows(input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor | None,
               flat_index: torch.Tensor, group: dist.ProcessGroup) -> LocalRows:
    """This rank's :class:`LocalRows` of the rows ``[rows, width]`` whose outputs are wanted at ``flat_index``
    (flat positions in the rows); ``attention_mask`` None: packed rows. Padding added to the rows' end is a
    sequence of its own (packed) or masked out (padded)."""
    size, rank = dist.get_world_size(group), dist.get_rank(group)
    rows, width = input_ids.shape
    pad = padded_length(width, size) - width
    input_ids = torch.nn.functional.pad(input_ids, (0, pad))
    tail = torch.arange(pad, device=position_ids.device).expand(rows, pad)  # the padding: a sequence of its own
    position_ids = torch.cat([position_ids, tail], dim=1)
    if attention_mask is not None:
        attention_mask = torch.nn.functional.pad(attention_mask, (0, pad))
    length = (width + pad) // size
    row, col = flat_index // width, flat_index % width
    held = (col >= rank * length) & (col < (rank + 1) * length)
    return LocalRows(local_slice(input_ids, rank, size), local_slice(position_ids, rank, size),
                     row[held] * length + col[held] - rank * length, held,
                     SequenceShard(group, position_ids, attention_mask))


def _all_to_all(tensor: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """Chunk ``i`` of ``tensor``'s first dimension to rank ``i``; chunk ``i`` of the result came from rank ``i``."""
    from torch.distributed._functional_collectives import all_to_all_single_autograd

    return all_to_all_single_autograd(tensor.contiguous(), None, None, group)


def heads_to_sequence(x: torch.Tensor, group: dist.ProcessGroup, size: int) -> torch.Tensor:
    """``[B, H, S/U, D]`` (all heads, this rank's slice) -> ``[B, H/U, S, D]`` (this rank's heads, the whole
    sequence)."""
    batch, heads, length, dim = x.shape
    chunks = x.reshape(batch, size, heads // size, length, dim).transpose(0, 1)  # [U, B, H/U, S/U, D] by head chunk
    received = _all_to_all(chunks, group)  # [U, B, H/U, S/U, D] by the sender's slice
    return received.permute(1, 2, 0, 3, 4).reshape(batch, heads // size, size * length, dim)


def sequence_to_heads(x: torch.Tensor, group: dist.ProcessGroup, size: int) -> torch.Tensor:
    """The inverse of :func:`heads_to_sequence`: ``[B, H/U, S, D]`` -> ``[B, H, S/U, D]``."""
    batch, heads, length, dim = x.shape
    chunks = x.reshape(batch, heads, size, length // size, dim).permute(2, 0, 1, 3, 4)  # [U, B, H/U, S/U, D]
    received = _all_to_all(chunks, group)  # [U, B, H/U, S/U, D] by the sender's heads
    return received.transpose(0, 1).reshape(batch, size * heads, length // size, dim)


def ulysses_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """Transformers' attention-function signature: ``query`` ``[B, H, S/U, D]``, ``key``/``value``
    ``[B, KV, S/U, D]`` of this rank's slice -> ``[B, S/U, H, D]``, attended over the whole sequence."""
    shard = _current
    if shard is None:
        raise RuntimeError(f"a model set to attn_implementation={ATTENTION!r} runs inside "
                           "rlplat.engines.ulysses.sharded(...) only")
    if kwargs.get("sliding_window"):
        raise NotImplementedError("Ulysses sequence parallelism does not support sliding-window attention yet")
    size, heads, kv_heads = shard.size, query.shape[1], key.shape[1]
    if kv_heads % size:  # too few key/value heads to split: every query head gets its own copy
        key = key.repeat_interleave(heads // kv_heads, dim=1)
        value = value.repeat_interleave(heads // kv_heads, dim=1)
    query, key, value = (heads_to_sequence(t, shard.group, size) for t in (query, key, value))
    if key.shape[1] != query.shape[1]:  # grouped-query attention: each key/value head serves a group
        key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
        value = value.repeat_interleave(query.shape[1] // value.shape[1], dim=1)
    out = _segment_attention(query, key, value, shard.segments(), dropout, scaling)
    return sequence_to_heads(out, shard.group, size).transpose(1, 2).contiguous(), None


def _segment_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                       segments: list[list[tuple[int, int]]], dropout: float, scaling: float | None) -> torch.Tensor:
    """Causal attention within each segment (``[B, H, S, D]``, the same heads for all three), one fused
    attention call per segment with no mask (so its memory grows with the segment's length, not its square);
    zeros outside the segments (padding)."""
    rows = []
    for row, spans in enumerate(segments):
        pieces, end = [], 0
        for start, stop in spans:
            if start > end:
                pieces.append(query.new_zeros(1, query.shape[1], start - end, query.shape[3]))
            piece = (t[row:row + 1, :, start:stop] for t in (query, key, value))
            pieces.append(torch.nn.functional.scaled_dot_product_attention(
                *piece, dropout_p=dropout, is_causal=True, scale=scaling))
            end = stop
        if end < query.shape[2]:
            pieces.append(query.new_zeros(1, query.shape[1], query.shape[2] - end, query.shape[3]))
        rows.append(torch.cat(pieces, dim=2))
    return torch.cat(rows)


def register() -> None:
    """Make :data:`ATTENTION` an attention implementation transformers' models can be set to."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION, ulysses_attention)



def check_heads(heads: int, size: int, key: str) -> None:
    """One config-error line when ``heads`` attention heads cannot be split over ``size`` ranks."""
    from rlplat.config.errors import ConfigError

    if heads % size:
        raise ConfigError(f"{key}={size}: each of the {size} ranks attends with 1/{size} of the heads, and the model "
                          f"has {heads} attention heads (num_attention_heads must divide by {key})")
