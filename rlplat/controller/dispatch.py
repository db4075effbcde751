"""How a call on a worker group reaches its workers and how their answers come back.

A worker method declares its mode with ``@register(Dispatch.X)`` (the modes are listed in
:mod:`rlplat.workers.base`); the WorkerGroup reads it, so the controller simply calls
``group.generate_sequences(batch)``: the arguments of a data-parallel call are split per replica here
and the collecting workers' answers gathered.
"""

from __future__ import annotations

from typing import Any

import torch

from rlplat.protocol import Batch
from rlplat.engines import ParallelLayout
from rlplat.workers.base import Dispatch


def check_layouts(layouts: list[ParallelLayout]) -> int:
    """The number of data-parallel replicas, after checking that the workers agree on it and that each
    replica has exactly one collecting worker."""
    dp_size = layouts[0].dp_size
    collectors = sorted(lay.dp_rank for lay in layouts if lay.collects)
    if any(lay.dp_size != dp_size or not 0 <= lay.dp_rank < dp_size for lay in layouts) \
            or collectors != list(range(dp_size)):
        raise RuntimeError(f"inconsistent parallel layout over {len(layouts)} workers: {layouts}; every worker "
                           f"must name the same dp_size and each replica exactly one collecting worker")
    return dp_size


def split_arguments(
    mode: Dispatch, layouts: list[ParallelLayout], args: tuple, kwargs: dict
) -> tuple[list[tuple[tuple, dict]], int]:
    """Per-worker (args, kwargs) for a data-parallel call, and the number of padding rows added: each
    Batch argument is split into one chunk per replica, and every worker gets its replica's chunk."""
    dp_size = check_layouts(layouts)
    batches = [a for a in (*args, *kwargs.values()) if isinstance(a, Batch)]
    if not batches:
        raise TypeError(f"{mode.name} dispatch needs at least one Batch argument")
    length = len(batches[0])
    if any(len(b) != length for b in batches):
        raise ValueError(f"{mode.name}: all Batch arguments must have the same length")
    pad = (-length) % dp_size
    if pad and mode is Dispatch.DP_SPLIT_EXACT:
        raise ValueError(
            f"a batch of {length} rows does not split evenly over {dp_size} data-parallel replicas; training "
            f"calls refuse to pad (a duplicated row would change the gradient): check the batch-size keys"
        )

    def chunks(value: Any) -> list[Any]:
        if not isinstance(value, Batch):
            return [value] * dp_size
        padded = value.pad_to_divisor(dp_size)[0] if pad else value
        return padded.chunk(dp_size)

    split_args = [chunks(a) for a in args]
    split_kwargs = {k: chunks(v) for k, v in kwargs.items()}
    per_worker = [
        (tuple(a[lay.dp_rank] for a in split_args), {k: v[lay.dp_rank] for k, v in split_kwargs.items()})
        for lay in layouts
    ]
    return per_worker, pad


def collect_results(results: list[Any], pad: int, layouts: list[ParallelLayout]) -> Any:
    """The collecting workers' answers in replica order: Batches concatenated (padding removed),
    anything else as a list with one entry per replica."""
    answers = [result for lay, result in sorted(zip(layouts, results), key=lambda pair: pair[0].dp_rank)
               if lay.collects]
    if all(isinstance(r, Batch) for r in answers):
        merged = Batch.concat(answers)
        return merged.unpad(pad) if pad else merged
    return answers


def balanced_order(lengths: torch.Tensor, parts: int) -> torch.Tensor:
    """A permutation of the rows such that the ``parts`` equal contiguous chunks a data-parallel call cuts
    hold about equal sums of ``lengths`` (tokens): longest rows first, each to the chunk with the fewest
    tokens that still has room. The identity when the rows do not split evenly."""
    rows = len(lengths)
    if parts <= 1 or rows % parts:
        return torch.arange(rows)
    size = rows // parts
    members: list[list[int]] = [[] for _ in range(parts)]
    load = [0] * parts
    for row in torch.argsort(lengths, descending=True, stable=True).tolist():
        part = min((p for p in range(parts) if len(members[p]) < size), key=lambda p: load[p])
        members[part].append(row)
        load[part] += int(lengths[row])
    return torch.tensor([row for part in members for row in sorted(part)])
