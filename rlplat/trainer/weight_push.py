"""The controller's half of weight sync: which calls move the actor's weights, and when. The weights themselves
go from worker to worker (:mod:`rlplat.workers.weight_sync`); the controller holds only their receipts and,
with ``rollout.weight_transport=object_store``, the updates on their way through Ray.

* :meth:`WeightPush.open_channels` at start-up: the weight channels from the actor's rank 0 to a separate
  rollout pool (``rollout.weight_transport=distributed``) and to a separate reference that ``ref.sync_steps``
  blends;
* :meth:`WeightPush.send` after each update (``rollout.mode=separate``) and :meth:`WeightPush.check` before
  samples are trained on: numbered updates and the rollout workers' receipts;
* :meth:`WeightPush.sync_reference`: the reference's blend towards the actor.
"""

from __future__ import annotations

from omegaconf import DictConfig

from rlplat.config.plan import RunPlan
from rlplat.controller import Pending, WorkerGroup
from rlplat.utils.errors import RunError
from rlplat.workers.weight_sync import probe_tolerance


class WeightPush:
    """The weight syncs of one run: the actor's group, the separate rollout pool and reference (None when
    colocated or absent), and the probe sequence a verified update carries (the first validation prompt)."""

    def __init__(self, cfg: DictConfig, plan: RunPlan, actor: WorkerGroup, rollout: WorkerGroup | None,
                 ref: WorkerGroup | None, probe_ids: list[int]):
        self.cfg, self.actor, self.rollout, self.ref = cfg, actor, rollout, ref
        self.separate_ref = plan.reference == "separate"
        self.tolerance = probe_tolerance(plan.rollout_log_probs_exact, cfg.rollout.verify_log_prob_tol)
        self.probe_ids = probe_ids if len(probe_ids) > 1 else None
        self.receipts: list[tuple[int, int, Pending]] = []  # (rank, weight version, receipt) not yet checked
        self.verified_once = False  # rollout.verify_weights=first: the first sync was checked
        self.version: int | None = None  # the newest update sent to the rollout pool

    def open_channels(self) -> None:
        """The torch.distributed groups that carry weights from the actor's rank 0: to the rollout workers
        (``rollout.weight_transport=distributed``) and to a separate reference that ``ref.sync_steps`` blends.
        Every member joins at once, at an address rank 0 chose."""
        if self.rollout is not None and self.cfg.rollout.weight_transport == "distributed":
            self._open("rollout", self.rollout)
        if self.separate_ref and self.cfg.ref.sync_steps > 0:
            self._open("ref", self.ref)

    def _open(self, to: str, receivers: WorkerGroup) -> None:
        host, port = self.actor.weight_channel_address()[0]
        size = 1 + receivers.world_size
        joining = [group.submit("join_weight_channel", to, host, port, size) for group in (self.actor, receivers)]
        for pending in joining:
            pending.result()

    def send(self, version: int, ranks: list[int] | None = None) -> float:
        """``rollout.mode=separate``: send the actor's weights, numbered ``version``, to every rollout worker
        (``ranks``: to those, new ones that replaced dead workers, checked whatever ``rollout.verify_weights`` says).
        The actor's gathers happen now; the rollout workers load the weights after the generations already
        submitted to them (each runs its calls in order), and :meth:`check` reads their receipts. Returns the MiB
        each rollout worker receives (a frozen vision tower's weights are not sent)."""
        mode = self.cfg.rollout.verify_weights
        verify = mode == "every" or (mode == "first" and not self.verified_once) or ranks is not None
        update = self.actor.weight_update(version, verify, self.probe_ids, self.tolerance)[0]
        receive = "receive_weights_between_tokens" if self.cfg.rollout.partial == "resume" else "receive_weights"
        self.receipts += [(rank, version, self.rollout.submit_to(rank, receive, update))
                          for rank in (range(self.rollout.world_size) if ranks is None else ranks)]
        self.verified_once = self.verified_once or verify
        self.version = version
        return update.nbytes / 2**20

    def replaceable(self, rank: int | None) -> list[int]:
        """The rollout workers to replace when worker ``rank`` died (None: one of them): that one, or, when the
        weights travel over a weight channel (``rollout.weight_transport=distributed``), all of them, as a
        torch.distributed group takes no new member and a broadcast that lost one may leave the others waiting."""
        if rank is None or self.cfg.rollout.weight_transport == "distributed":
            return list(range(self.rollout.world_size))
        return [rank]

    def replaced(self, ranks: list[int], version: int) -> float:
        """New rollout workers in the places of ``ranks`` (their models loaded): forget the dead ones' receipts,
        open a new weight channel when the weights travel over one, and send them the actor's weights (numbered
        ``version``: those the actor holds), checked, waiting for the new workers' receipts. Returns the MiB sent
        to each."""
        self.receipts = [receipt for receipt in self.receipts if receipt[0] not in ranks]
        if self.cfg.rollout.weight_transport == "distributed":
            self._open("rollout", self.rollout)
        sent_mb = self.send(version, ranks)
        self.check({rank: version for rank in ranks})
        return sent_mb

    def removed(self, ranks: list[int]) -> None:
        """The rollout pool goes on without the workers of ``ranks`` (:meth:`WorkerGroup.remove`): forget their
        receipts; the ranks after them move down."""
        self.receipts = [(rank - sum(gone < rank for gone in ranks), version, receipt)
                         for rank, version, receipt in self.receipts if rank not in ranks]

    def check(self, needed: dict[int, int] | None = None) -> None:
        """Read the rollout workers' receipts of the weight syncs: those already back, and, waiting for them,
        those of each rank in ``needed`` up to its version (the weights of the samples about to be trained;
        None: every sync sent so far). A rollout worker that does not hold exactly what the actor sent stops the
        run (:class:`RunError`, naming the tensor)."""
        waiting = []
        for rank, version, receipt in self.receipts:
            if needed is not None and version > needed.get(rank, -1) and not receipt.done():
                waiting.append((rank, version, receipt))
            elif problem := receipt.result():
                raise RunError(f"weight sync to rollout worker {rank}: {problem}; the run stops rather than "
                               f"train on samples of weights that are not the actor's (rollout.verify_weights="
                               f"{self.cfg.rollout.verify_weights})")
        self.receipts = waiting

    def sync_reference(self, alpha: float) -> None:
        """Reference <- alpha * actor + (1 - alpha) * reference: inside each actor worker when colocated; a
        separate reference receives the actor's weights over its weight channel, bucket by bucket."""
        if not self.separate_ref:
            self.actor.sync_reference(alpha)
            return
        layouts = self.actor.send_reference()[0]  # rank 0's: the tensors go on over the channel
        self.ref.blend_reference(layouts, alpha)
