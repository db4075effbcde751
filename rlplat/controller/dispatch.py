"""How a call on a worker group reaches its workers and how their answers come back.

A worker method declares its mode with ``@register(Dispatch.X)``; the WorkerGroup reads it, so the
controller simply calls ``group.generate_sequences(batch)``:

==================  ==========================================================================
``ONE_TO_ALL``      every worker gets the same arguments; the list of their results comes back
``RANK_ZERO``       only rank 0 is called; its result comes back (e.g. writing one file)
``DP_SPLIT``        :class:`~rlplat.protocol.Batch` arguments are split into one equal chunk per
                    data-parallel rank, padded first if the length does not divide (inference); the
                    chunks' Batch results are concatenated and the padding removed ("collect")
``DP_SPLIT_EXACT``  like DP_SPLIT but refuses to pad: for training, where a duplicated row would
                    change the gradient; non-Batch results come back as a list, one per rank
==================  ==========================================================================
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

from rlplat.protocol import Batch

DISPATCH_ATTR = "__rlplat_dispatch__"


class Dispatch(enum.Enum):
    ONE_TO_ALL = "one_to_all"
    RANK_ZERO = "rank_zero"
    DP_SPLIT = "dp_split"
    DP_SPLIT_EXACT = "dp_split_exact"


def register(mode: Dispatch) -> Callable[[Callable], Callable]:
    """Mark a worker method as callable from the controller, with its dispatch mode."""

    def decorator(fn: Callable) -> Callable:
        setattr(fn, DISPATCH_ATTR, mode)
        return fn

    return decorator


def dispatch_mode(worker_cls: type, name: str) -> Dispatch:
    fn = getattr(worker_cls, name, None)
    mode = getattr(fn, DISPATCH_ATTR, None)
    if mode is None:
        exposed = sorted(n for n in dir(worker_cls) if getattr(getattr(worker_cls, n), DISPATCH_ATTR, None))
        raise AttributeError(
            f"{worker_cls.__name__}.{name} is not a worker method registered with @register(Dispatch...); "
            f"exposed: {', '.join(exposed)}"
        )
    return mode


def split_arguments(
    mode: Dispatch, world_size: int, args: tuple, kwargs: dict
) -> tuple[list[tuple[tuple, dict]], int]:
    """Per-rank (args, kwargs) and the number of padding rows added (0 if none)."""
    if mode in (Dispatch.ONE_TO_ALL, Dispatch.RANK_ZERO):
        ranks = 1 if mode is Dispatch.RANK_ZERO else world_size
        return [(args, kwargs)] * ranks, 0
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
    if mode is Dispatch.RANK_ZERO:
        return results[0]
    if mode is Dispatch.ONE_TO_ALL:
        return results
    if all(isinstance(r, Batch) for r in results):
        merged = Batch.concat(results)
        return merged.unpad(pad) if pad else merged
    return results
