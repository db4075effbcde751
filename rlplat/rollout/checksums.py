"""Exact checksums of tensors: what a rollout engine reports of the weights it holds
(:meth:`~rlplat.rollout.base.RolloutEngine.weight_checksums`), against those of the weights the actor sent
(:mod:`rlplat.workers.weight_sync`)."""

from __future__ import annotations

from collections.abc import Iterable

import torch

_MODULUS = 2**61 - 1  # a Mersenne prime: the running sum stays an exact Python int of bounded size
_CHUNK = 1 << 24  # bytes weighed at once (the int64 copy of a chunk is 8x its size)


def tensor_checksum(tensor: torch.Tensor) -> int:
    """An exact fingerprint of a tensor's bits, computed where the tensor lives: the sum of its bytes, each
    weighted by its position (mod 65521, + 1), modulo 2**61 - 1. Equal bits give equal checksums; a changed,
    swapped or missing byte changes it (except with negligible chance). The dtype is part of the bits:
    the same values in another dtype differ."""
    data = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    total = 0
    for start in range(0, data.numel(), _CHUNK):
        chunk = data[start:start + _CHUNK].to(torch.int64)
        weights = torch.arange(start, start + chunk.numel(), device=chunk.device, dtype=torch.int64) % 65521 + 1
        total = (total + int((chunk * weights).sum())) % _MODULUS
    return total


Checksum = tuple[int, str, tuple[int, ...]]  # the bits' checksum, the dtype, the shape


def named_checksums(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, Checksum]:
    """Each tensor's :func:`tensor_checksum` with its dtype and shape (equal bytes cast or reshaped differ)."""
    return {name: (tensor_checksum(t), str(t.dtype).removeprefix("torch."), tuple(t.shape)) for name, t in named}
