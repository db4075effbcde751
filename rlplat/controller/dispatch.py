"""How a call on a worker group reaches its workers and how their answers come back.

A worker method declares its mode with ``@register(Dispatch.X)`` (the modes are listed in
:mod:`rlplat.workers.base`); the WorkerGroup reads it, so the controller simply calls
``group.generate_sequences(batch)``: the arguments are split per rank here and the answers collected.
"""

from __future__ import annotations

from typing import Any

from rlplat.protocol import Batch
from rlplat.workers.base import Dispatch


def split_arguments(
    mode: Dispatch, world_size: int, args: tuple, kwargs: dict
) -> tuple[list[tuple[tuple, dict]], int]:
    """Per-rank (args, kwargs) and the number of padding rows added (0 if none)."""
    if mode is Dispatch.ONE_TO_ALL:
        return [(args, kwargs)] * world_size, 0
    batches = [a for a in (*args, *kwargs.values()) if isinstance(a, Batch)]
    if not batches:
        raise TypeError(f"{mode.name} dispatch needs at least one Batch argument")
    length = len(batches[0])
    if any(len(b) != length for b in batches):
        raise ValueError(f"{mode.name}: all Batch arguments must have the same length")
    pad = (-length) % world_size
    if pad and mode is Dispatch.DP_SPLIT_EXACT:
        raise ValueError(
            f"a batch of {length} rows does not split evenly over {world_size} workers; training calls "
            f"refuse to pad (a duplicated row would change the gradient): check the batch-size keys"
        )

    def chunks(value: Any) -> list[Any]:
        if not isinstance(value, Batch):
            return [value] * world_size
        padded = value.pad_to_divisor(world_size)[0] if pad else value
        return padded.chunk(world_size)

    split_args = [chunks(a) for a in args]
    split_kwargs = {k: chunks(v) for k, v in kwargs.items()}
    per_rank = [
        (tuple(a[r] for a in split_args), {k: v[r] for k, v in split_kwargs.items()}) for r in range(world_size)
    ]
    return per_rank, pad


def collect_results(mode: Dispatch, results: list[Any], pad: int) -> Any:
    if mode is Dispatch.ONE_TO_ALL:
        return results
    if all(isinstance(r, Batch) for r in results):
        merged = Batch.concat(results)
        return merged.unpad(pad) if pad else merged
    return results
