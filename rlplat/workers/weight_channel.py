"""The torch.distributed transport of weights from the actor to another pool: a separate rollout pool's
updates (``rollout.weight_transport=distributed``) and a separate reference's blend (``ref.sync_steps``).

A process group of its own joins the actor's rank 0 (rank 0 here) and the other pool's workers (ranks 1..R):
gloo between CPU workers, NCCL between GPUs, as OpenRLHF and open-instruct sync their vLLM engines. It is
independent of each pool's own group (created from a TCP store at an address the actor's rank 0 chose).

Each bucket of an update travels as one broadcast of its tensors' bytes packed end to end (each tensor at a
16-byte-aligned offset); the receivers know the bucket's layout (names, dtypes, shapes) from the update's
header, which goes through Ray with the rest of the :class:`~rlplat.workers.weight_sync.WeightUpdate`.

The actor sends from a thread of its own, so the trainer goes on computing while rollout workers are still
busy with the generations submitted before the update (they receive it in their call order, bucket by
bucket, loading each into the engine as it arrives: one bucket in memory at a time on their side; with
``rollout.partial=resume`` a worker receives the whole update beside the generation under way and holds it
until it loads it between two tokens). One update is in flight at a time: the next waits for the previous
to be received.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from datetime import timedelta

import torch

from rlplat.rollout.base import WeightBucket
from rlplat.utils.errors import ChannelBroken

#: a bucket's layout: (name, dtype name, shape) of each tensor, in order
BucketLayout = list[tuple[str, str, tuple[int, ...]]]

_ALIGN = 16  # bytes: every tensor starts at a multiple of it in the packed buffer (any dtype can view it)


def bucket_layout(bucket: WeightBucket) -> BucketLayout:
    return [(name, str(t.dtype).removeprefix("torch."), tuple(t.shape)) for name, t in bucket]


def _spans(layout: BucketLayout) -> tuple[list[tuple[int, int]], int]:
    """Each tensor's (offset, bytes) in the packed buffer, and the buffer's size."""
    spans, offset = [], 0
    for _, dtype, shape in layout:
        size = torch.Size(shape).numel() * getattr(torch, dtype).itemsize
        spans.append((offset, size))
        offset += -(-size // _ALIGN) * _ALIGN
    return spans, offset


def pack(bucket: WeightBucket) -> torch.Tensor:
    """The bucket's tensors' bytes end to end in one uint8 tensor (see :func:`unpack`)."""
    spans, total = _spans(bucket_layout(bucket))
    flat = torch.zeros(total, dtype=torch.uint8)
    for (_, tensor), (offset, size) in zip(bucket, spans):  # one copy each, from wherever the tensor lives
        flat[offset:offset + size].view(tensor.dtype).view(tensor.shape).copy_(tensor.detach())
    return flat


def unpack(flat: torch.Tensor, layout: BucketLayout) -> WeightBucket:
    """The named tensors packed in ``flat`` (views of it, no copy)."""
    spans, _ = _spans(layout)
    return [(name, flat[offset:offset + size].view(getattr(torch, dtype)).view(shape))
            for (name, dtype, shape), (offset, size) in zip(layout, spans)]


class WeightChannel:
    """This process's end of the weight group: rank 0 (the actor's rank 0) sends, ranks 1..R receive."""

    def __init__(self, host: str, port: int, rank: int, size: int, device: str, timeout_s: float = 1800.0):
        import torch.distributed as dist

        timeout = timedelta(seconds=timeout_s)
        store = dist.PrefixStore("rlplat-weights", dist.TCPStore(host, port, size, rank == 0, timeout=timeout))
        self.device = torch.device(device)
        if self.device.type == "cuda":
            self.group = dist.ProcessGroupNCCL(store, rank, size)
        else:
            self.group = dist.ProcessGroupGloo(store, rank, size, timeout)
        self.rank, self.size = rank, size
        self._sending: threading.Thread | None = None
        self._error: BaseException | None = None

    def send(self, packed: Sequence[torch.Tensor]) -> None:
        """Broadcast the packed buckets (:func:`pack`; rank 0) in a thread of its own, after the previous update
        has gone."""
        self.wait()
        self._sending = threading.Thread(target=self._send, args=(list(packed),), daemon=True,
                                         name="rlplat-weight-send")
        self._sending.start()

    def _send(self, packed: list[torch.Tensor]) -> None:
        try:
            for flat in packed:
                self.group.broadcast(flat.to(self.device), 0).wait()
        except BaseException as err:  # raised to the caller of the next send() or wait()
            self._error = err

    def wait(self) -> None:
        """Until the update being sent has been received by every rollout worker (re-raises its failure)."""
        if self._sending is not None:
            self._sending.join()
            self._sending = None
        if self._error is not None:
            error, self._error = self._error, None
            raise ChannelBroken(f"sending weights to the workers of the weight channel failed: {error}") from error

    def close(self, timeout_s: float = 60.0) -> None:
        """Leave this channel for a new one (its receivers were replaced): a send under way ends at its first lost
        receiver (their processes are gone), and its error no longer matters."""
        if self._sending is not None:
            self._sending.join(timeout_s)
        self._sending = self._error = None

    def receive(self, layouts: Sequence[BucketLayout]) -> Iterator[WeightBucket]:
        """The update's buckets as they arrive (ranks 1..R), one broadcast each."""
        for layout in layouts:
            flat = torch.empty(_spans(layout)[1], dtype=torch.uint8, device=self.device)
            self.group.broadcast(flat, 0).wait()
            yield unpack(flat, layout)
