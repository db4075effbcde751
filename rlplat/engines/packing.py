"""Padding-free forward passes: a micro-batch's sequences packed end to end into a few rows.

A rollout batch is left-padded prompts followed by right-padded responses, so every row costs the longest
prompt plus the longest response. Packing drops the padding: each sequence's real tokens are placed one
after another in rows of ``capacity`` tokens (first-fit decreasing, capacity = the longest sequence), and
position ids restart at 0 for each sequence. Hugging Face models given ``position_ids`` and no attention
mask treat every restart as a new sequence (``masking_utils.find_packed_sequence_indices``, transformers
>= 4.56) and build a block-diagonal causal mask, so no token attends across sequences; the engines check
that at start-up (:func:`packing_matches_padded`) and fall back to padded batches for a model that does not.

Outputs are needed only at the positions that predict response tokens; :class:`PackedBatch` knows where
those are, in the packed rows and in the ``[B, R]`` response layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices of ``lengths`` grouped into bins whose lengths sum to at most ``capacity``, longest first."""
    bins: list[list[int]] = []
    room: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        for b, free in enumerate(room):
            if lengths[index] <= free:
                bins[b].append(index)
                room[b] -= lengths[index]
                break
        else:
            bins.append([index])
            room.append(capacity - lengths[index])
    return bins


@dataclass
class PackedBatch:
    """A micro-batch's sequences packed into ``[rows, capacity]`` (see the module docstring)."""

    input_ids: torch.Tensor  # [rows, capacity]
    position_ids: torch.Tensor  # [rows, capacity], restarting at 0 for every sequence (and the row's tail)
    flat_index: torch.Tensor  # [N] positions (in the flattened rows) that predict a response token
    targets: torch.Tensor  # [N] the response token each of them predicts
    dest_row: torch.Tensor  # [N] where its output goes in the [B, R] response layout
    dest_col: torch.Tensor  # [N]
    shape: tuple[int, int]  # (B, R)
    real_tokens: int  # tokens that are not padding (the packing efficiency's numerator)
    real: torch.Tensor  # [rows * capacity] bool: which positions of the flattened rows hold a real token
    # every token the rows hold, from where in the [B, P + R] batch ([N] each) to where in the flattened rows
    token_row: torch.Tensor
    token_col: torch.Tensor
    token_dest: torch.Tensor

    @classmethod
    def build(cls, input_ids: torch.Tensor, attention_mask: torch.Tensor, responses: torch.Tensor) -> PackedBatch | None:
        """Pack ``input_ids`` ``[B, P + R]`` (left-padded prompts, right-padded responses, real tokens
        marked by ``attention_mask``); None when some row's real tokens are not one run that starts in
        the prompt part."""
        batch, width = input_ids.shape
        response_len = responses.shape[1]
        prompt_width = width - response_len
        mask = attention_mask.bool()
        lengths = mask.sum(-1)
        first = mask.long().argmax(-1)
        last = width - 1 - mask.flip(-1).long().argmax(-1)
        if bool((lengths == 0).any() | (last - first + 1 != lengths).any() | (first >= prompt_width).any()):
            return None
        lengths_list = lengths.tolist()
        capacity = max(lengths_list)
        bins = first_fit_decreasing(lengths_list, capacity)
        starts = [0] * batch  # where each sequence starts in the flattened rows
        used = []  # the tokens each row holds
        for row, members in enumerate(bins):  # plain ints: a tensor write per sequence is slow (docs/performance.md)
            offset = row * capacity
            for b in members:
                starts[b] = offset
                offset += lengths_list[b]
            used.append(offset - row * capacity)
        row_start = torch.tensor(starts)
        # every real token: its sequence, its index t within the sequence, and where it goes
        seq = torch.repeat_interleave(torch.arange(batch), lengths)
        t = torch.arange(int(lengths.sum())) - torch.repeat_interleave(lengths.cumsum(0) - lengths, lengths)
        ids = torch.zeros(len(bins) * capacity, dtype=input_ids.dtype)
        positions = torch.zeros(len(bins) * capacity, dtype=torch.long)
        dest = row_start[seq] + t
        ids[dest] = input_ids[seq, first[seq] + t]
        positions[dest] = t
        real = torch.zeros(len(bins) * capacity, dtype=torch.bool)
        real[dest] = True
        tail = torch.arange(capacity) - torch.tensor(used)[:, None]  # the tail of a row is a sequence of its own
        positions = torch.where(tail >= 0, tail, positions.view(len(bins), capacity))
        # the output at token t predicts token t + 1: response token j is predicted by the sequence's token
        # prompt_len + j - 1, for the response tokens the row really has
        prompt_len = (prompt_width - first)[seq]
        predicts = (t >= prompt_len - 1) & (t <= lengths[seq] - 2)
        j = (t - prompt_len + 1)[predicts]
        rows = seq[predicts]
        return cls(ids.view(len(bins), capacity), positions, dest[predicts], responses[rows, j].long(), rows, j,
                   (batch, response_len), int(lengths.sum()), real, seq, first[seq] + t, dest)

    @classmethod
    def padded(cls, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
               responses: torch.Tensor) -> PackedBatch:
        """The same outputs for the batch as it is (one padded sequence per row): every response position
        is computed, padding included."""
        batch, width = input_ids.shape
        response_len = responses.shape[1]
        rows = torch.arange(batch).repeat_interleave(response_len)
        cols = torch.arange(response_len).repeat(batch)
        flat = rows * width + (width - response_len - 1) + cols
        return cls(input_ids, position_ids, flat, responses.reshape(-1).long(), rows, cols,
                   (batch, response_len), int(attention_mask.sum()), attention_mask.bool().reshape(-1),
                   torch.arange(batch).repeat_interleave(width), torch.arange(width).repeat(batch),
                   torch.arange(batch * width))

    @property
    def efficiency(self) -> float:
        """Real tokens over the tokens the packed rows compute."""
        return self.real_tokens / self.input_ids.numel()

    def pack(self, values: torch.Tensor, fill: int = 0) -> torch.Tensor:
        """A per-token field of the batch, ``[B, P + R, ...]``, laid out as the flattened rows ``[rows * capacity,
        ...]`` (``fill`` where the rows hold no token of the batch)."""
        out = values.new_full((self.input_ids.numel(), *values.shape[2:]), fill)
        out[self.token_dest] = values[self.token_row, self.token_col]
        return out

    def unpack(self, flat: torch.Tensor, width: int, fill: int = 0) -> torch.Tensor:
        """The inverse of :meth:`pack`: ``[rows * capacity, ...]`` -> ``[B, width, ...]`` (``fill`` on padding)."""
        out = flat.new_full((self.shape[0], width, *flat.shape[1:]), fill)
        out[self.token_row.to(flat.device), self.token_col.to(flat.device)] = flat[self.token_dest.to(flat.device)]
        return out

    def sequence_order(self) -> list[int]:
        """The batch's rows in the order their tokens come in the flattened rows."""
        first = torch.full((self.shape[0],), self.input_ids.numel(), dtype=torch.long)
        first.scatter_reduce_(0, self.token_row, self.token_dest, reduce="amin")
        return first.argsort(stable=True).tolist()

    def scatter(self, values: torch.Tensor) -> torch.Tensor:
        """``[N]`` outputs at the response-predicting positions -> ``[B, R]`` (0 where no response token)."""
        out = values.new_zeros(self.shape)
        out[self.dest_row.to(values.device), self.dest_col.to(values.device)] = values
        return out
