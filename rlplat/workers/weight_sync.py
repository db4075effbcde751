"""The one home of weight sync: the actor's weights (or its LoRA adapters alone) as each of their consumers
receives them, streamed in buckets, never whole through the controller.

:class:`WeightSync` is built once per worker from the config. It chooses once whether the rollout engines
get the weights or the adapters (``rollout.lora_sync``), and serves every consumer:

* the **colocated rollout engine** (:meth:`WeightSync.to_engine`): the actor's live tensors when the engine can
  use them as they are, else copies in buckets of ``rollout.weight_sync_bucket_mb`` in the rollout's dtype;
* a **separate rollout pool** (``rollout.mode=separate``, :meth:`WeightSync.update`): a numbered
  :class:`WeightUpdate`, its buckets over a :class:`~rlplat.workers.weight_channel.WeightChannel`
  (``rollout.weight_transport=distributed``) or through Ray (``object_store``), which each rollout worker
  loads (:meth:`WeightSync.load`) and checks;
* the **reference policy's blend** (``ref.sync_steps``, :meth:`WeightSync.blend_reference`): inside the
  actor's worker when colocated (bucket by bucket, or the LoRA reference's adapters), and over a weight
  channel of its own to a separate reference pool (:meth:`WeightSync.send_reference`).

The checks an update carries when ``rollout.verify_weights`` asks for them, made by the rollout worker after
loading it:

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

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace

import torch
from omegaconf import DictConfig

from rlplat.config.plan import RunPlan
from rlplat.engines import TrainingEngine
from rlplat.rollout.base import RolloutEngine, WeightBucket
from rlplat.rollout.checksums import Checksum, named_checksums
from rlplat.workers.weight_channel import BucketLayout, WeightChannel, bucket_layout, pack, unpack


class WeightSync:
    """This worker's end of weight sync (see the module's docstring): the sending side in the actor's workers,
    the receiving side in a rollout or reference worker. ``channels`` holds the weight channels this worker
    joined, on either end, by the name of the receiving pool (``"rollout"``, ``"ref"``)."""

    def __init__(self, cfg: DictConfig, plan: RunPlan):
        self.adapters = bool(cfg.model.lora.rank) and cfg.rollout.lora_sync == "adapter"
        self.lora_cfg = cfg.model.lora
        self.dtype = getattr(torch, plan.rollout_dtype)
        self.bucket_bytes = cfg.rollout.weight_sync_bucket_mb * 2**20
        self.channels: dict[str, WeightChannel] = {}

    # ------------------------------------------------------------------ the actor's side
    def outgoing(self, actor: TrainingEngine) -> Iterator[WeightBucket]:
        """The actor's weights as the rollout engines receive them: in the rollout's dtype, merged with LoRA,
        or the adapters alone (gathered bucket by bucket: collective over the actor's ranks)."""
        if self.adapters:
            return actor.lora.export(self.dtype, self.bucket_bytes)
        buckets = actor.export_weights(self.dtype, self.bucket_bytes)
        if not actor.frozen_names:
            return buckets
        return ([(name, t) for name, t in bucket if name not in actor.frozen_names] for bucket in buckets)

    def to_engine(self, actor: TrainingEngine, rollout: RolloutEngine) -> int:
        """The colocated rollout engine gets the actor's current weights: its live tensors when the engine can
        share them (nothing to copy, now or after an update), else copies. Returns the bytes copied."""
        if self.shares(actor, rollout):
            return 0
        copied = [0]
        self.load(rollout, _counted(self.outgoing(actor), copied))
        return copied[0]

    @staticmethod
    def shares(actor: TrainingEngine, rollout: RolloutEngine) -> bool:
        """Give the rollout engine the actor's live tensors when it can use them as they are (one model in
        memory); False when it cannot."""
        live = actor.live_weights()
        return live is not None and rollout.share_weights(live)

    def update(self, actor: TrainingEngine, rank: int, version: int, verify: bool) -> WeightUpdate | None:
        """The actor's weights as one numbered :class:`WeightUpdate` for a separate rollout pool, with each
        tensor's checksum when ``verify``. Rank 0 returns it; the other ranks take part in the gathers and
        return None. Over a weight channel the tensors go from a thread of their own, and the update comes back
        without them (:meth:`WeightUpdate.header`)."""
        channel = self.channels.get("rollout")
        return _sent(self.outgoing(actor), rank, channel, lambda buckets: WeightUpdate.of(
            version, buckets, verify, pack_buckets=channel is not None))

    def blend_reference(self, actor: TrainingEngine, ref: TrainingEngine | None, alpha: float) -> None:
        """The colocated reference <- alpha * actor + (1 - alpha) * reference, one bucket at a time; with LoRA
        (``ref`` None: the reference is the actor's base model) the reference's adapters, each rank its shards."""
        if ref is None:
            actor.lora.blend_reference(alpha)
            return
        ref.blend_weights(actor.export_weights(bucket_bytes=self.bucket_bytes), alpha)

    def send_reference(self, actor: TrainingEngine, rank: int) -> list[BucketLayout] | None:
        """A separate reference pool's blend: the actor's full weights (as trained, merged with LoRA) over the
        ``"ref"`` channel from a thread of their own; rank 0 returns their layouts, which the reference
        workers receive them by (:meth:`receive`), the other ranks take part in the gathers and return None."""
        update = _sent(actor.export_weights(bucket_bytes=self.bucket_bytes), rank, self.channels["ref"],
                       lambda buckets: WeightUpdate.of(0, buckets, verify=False, pack_buckets=True))
        return update.layouts if update is not None else None

    def join(self, to: str, host: str, port: int, rank: int, size: int, device: str) -> None:
        """Open this worker's end of the weight channel to the ``to`` pool: rank 0 the actor's sender, ranks
        1..size-1 that pool's workers. A channel already open to ``to`` is left (its receivers were replaced)."""
        if (old := self.channels.pop(to, None)) is not None:
            old.close()
        self.channels[to] = WeightChannel(host, port, rank, size, device)

    # ------------------------------------------------------------------ the receiving side
    def load(self, rollout: RolloutEngine, buckets: Iterable[WeightBucket]) -> None:
        """Load the actor's buckets into a rollout engine: the weights, or the adapters alone."""
        if self.adapters:
            rollout.load_adapters(buckets, self.lora_cfg)
        else:
            rollout.load_weights(buckets)

    def receive(self, layouts: list[BucketLayout], to: str) -> Iterator[WeightBucket]:
        """The buckets of these layouts as they arrive over the channel to this worker's pool ``to``, one at a
        time."""
        return self.channels[to].receive(layouts)


def _counted(buckets: Iterable[WeightBucket], total: list[int]) -> Iterator[WeightBucket]:
    """``buckets`` as they are, adding their tensors' bytes to ``total[0]``."""
    for bucket in buckets:
        total[0] += sum(tensor.numel() * tensor.element_size() for _, tensor in bucket)
        yield bucket


def _sent(buckets: Iterator[WeightBucket], rank: int, channel: WeightChannel | None, make) -> WeightUpdate | None:
    """Rank 0: ``make(buckets)``, its packed tensors sent over ``channel`` when there is one (the update's header
    returned). Other ranks: the gathers taken part in, None."""
    if rank != 0:
        for _ in buckets:  # the gathers are collective: take part, keep nothing
            pass
        return None
    update = make(buckets)
    if channel is None:
        return update
    channel.send(update.packed)
    return update.header()


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

    @property
    def nbytes(self) -> int:
        """The bytes of the tensors the update carries (over a weight channel: of its layouts)."""
        if self.layouts:
            return sum(torch.Size(shape).numel() * getattr(torch, dtype).itemsize
                       for layout in self.layouts for _, dtype, shape in layout)
        return sum(t.numel() * t.element_size() for bucket in self.buckets for _, t in bucket)

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
