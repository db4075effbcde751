"""Weights sent from the actor to a pool of rollout workers (``rollout.mode=separate``), numbered and checked.

Every update carries the actor's version (the number of updates it has applied) and, when
``rollout.verify_weights`` asks for it, two checks the rollout worker makes after loading it into its engine:

* **checksums**: an exact checksum of every tensor as the actor sent it, against those of what the engine
  then holds (:meth:`~rlplat.rollout.base.RolloutEngine.weight_checksums`): a tensor dropped, cast,
  transposed or corrupted on the way is named;
* **a log-prob probe**: the actor's log-probs of a fixed token sequence (the first validation prompt), against
  the engine's own (:meth:`~rlplat.rollout.base.RolloutEngine.sequence_log_probs`): weights that load
  without error into the wrong places (a fused projection split the wrong way) show here, also in engines
  that cannot show their tensors (vLLM).

Either failing stops the run before it trains on a sample of those weights.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

import torch

from rlplat.rollout.base import WeightBucket
from rlplat.rollout.weight_channel import BucketLayout, bucket_layout, pack, unpack

_MODULUS = 2**61 - 1  # a Mersenne prime: the running sum stays an exact Python int of bounded size
_CHUNK = 1 << 24  # bytes weighed at once (the int64 copy of a chunk is 8x its size)

#: test hook: the name of a tensor that the actor perturbs in an update on its way to the rollout workers, so a
#: test can show that a corrupted bucket stops the run (read by the controller, passed to the actor)
CORRUPT_ENV = "RLPLAT_TEST_CORRUPT_WEIGHT"


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


@dataclass
class WeightUpdate:
    """The actor's full weights at one version, in the rollout's dtype, as the rollout pool receives them."""

    version: int  # the actor's optimizer updates so far (0 = the initial model)
    buckets: list[WeightBucket]
    checksums: dict[str, Checksum] = field(default_factory=dict)  # empty: not verified (rollout.verify_weights)
    probe_ids: list[int] = field(default_factory=list)  # the probe's tokens (empty: no probe)
    probe_log_probs: list[float] = field(default_factory=list)  # the actor's log-probs of probe_ids[1:]
    probe_tolerance: float = 0.0  # the largest |difference| of one token's log-prob allowed
    # rollout.weight_transport=distributed: the buckets travel over a WeightChannel (buckets is then empty), in
    # these layouts
    layouts: list[BucketLayout] = field(default_factory=list)
    packed: list[torch.Tensor] = field(default_factory=list)  # each bucket's bytes in one buffer (buckets views it)

    @classmethod
    def of(cls, version: int, buckets: Iterable[WeightBucket], verify: bool,
           pack_buckets: bool = False) -> WeightUpdate:
        """The update of ``buckets``, each tensor copied to the host once: a clone of its own, or with
        ``pack_buckets`` (for a weight channel) into its bucket's one buffer
        (:func:`~rlplat.rollout.weight_channel.pack`, :attr:`packed`) that the update's tensors are views of.
        Such views must not travel through pickle (each would carry its whole buffer): :meth:`header` drops them."""
        packed, kept = [], []
        for bucket in buckets:
            if pack_buckets:
                packed.append(pack(bucket))
                kept.append(unpack(packed[-1], bucket_layout(bucket)))
            else:
                kept.append([(name, tensor.detach().cpu().clone()) for name, tensor in bucket])
        checksums = named_checksums((name, t) for bucket in kept for name, t in bucket) if verify else {}
        return cls(version, kept, checksums, packed=packed)

    def header(self) -> WeightUpdate:
        """This update without its tensors, which go over a :class:`~rlplat.rollout.weight_channel.WeightChannel`
        (:attr:`packed`): their layouts instead."""
        return replace(self, buckets=[], packed=[], layouts=[bucket_layout(bucket) for bucket in self.buckets])


def weight_mismatch(update: WeightUpdate, held: Mapping[str, Checksum]) -> str | None:
    """What differs between the update's checksums and those of what the engine holds after loading it (one
    line naming the first tensor and how many differ), or None when every sent tensor is held bit for bit."""
    missing = [name for name in update.checksums if name not in held]
    changed = [name for name in update.checksums if name in held and held[name] != update.checksums[name]]
    if not missing and not changed:
        return None
    first = (f"holds no tensor {missing[0]!r}" if missing else
             f"holds {changed[0]!r} with other bits than the actor sent")
    return (f"after the sync of weight version {update.version}, the rollout engine {first} "
            f"({len(missing) + len(changed)} of {len(update.checksums)} tensors differ)")


#: the probe's default tolerance for an engine whose log-probs are not the actor's own (another engine's
#: kernels, 16-bit weights): a loose bound that weights loaded into the wrong places still break (they move
#: log-probs by nats), which kernel and rounding differences (up to ~1e-1 in bfloat16) do not
LOOSE_PROBE_TOLERANCE = 0.5


def probe_tolerance(exact: bool, configured: float | None) -> float:
    """``rollout.verify_log_prob_tol``, or by default 1e-5 where the rollout's log-probs are the actor's own
    to float error (the HF engine in float32: :attr:`~rlplat.config.plan.RunPlan.rollout_log_probs_exact`),
    else :data:`LOOSE_PROBE_TOLERANCE`."""
    if configured is not None:
        return configured
    return 1e-5 if exact else LOOSE_PROBE_TOLERANCE


def probe_mismatch(update: WeightUpdate, rollout_log_probs: list[float]) -> str | None:
    """One line when the engine's log-probs of the probe differ from the actor's by more than the update's
    tolerance at some token (the largest difference and where), else None."""
    gaps = [abs(a - b) for a, b in zip(update.probe_log_probs, rollout_log_probs)]
    if len(rollout_log_probs) != len(update.probe_log_probs):
        return (f"after the sync of weight version {update.version}, the rollout engine scored "
                f"{len(rollout_log_probs)} tokens of the {len(update.probe_log_probs)}-token probe")
    worst = max(range(len(gaps)), key=gaps.__getitem__, default=None)
    if worst is None or gaps[worst] <= update.probe_tolerance:
        return None
    return (f"after the sync of weight version {update.version}, the rollout engine's log-probs of the probe "
            f"sequence differ from the actor's by {gaps[worst]:.2e} at token {worst + 1} (tolerance "
            f"{update.probe_tolerance:g}: rollout.verify_log_prob_tol)")


def corruption_for_test() -> str | None:
    """The :data:`CORRUPT_ENV` test hook, read where the run starts: the tensor to damage (None: unset)."""
    return os.environ.get(CORRUPT_ENV) or None


def corrupt_for_test(update: WeightUpdate, name: str | None) -> None:
    """Add 1 to the first element of the tensor ``name`` (:func:`corruption_for_test`; nothing if None), after
    its checksum was taken: the update arrives with other bits than the actor sent."""
    for bucket in update.buckets if name else []:
        for key, tensor in bucket:
            if key == name:  # in place: the update's own copy (and its packed buffer) changes
                tensor.view(-1)[0] += 1
