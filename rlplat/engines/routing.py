"""A training engine's forward of a mixture of experts: the routing it replays, what it records, and the routers'
loss and metrics from it (the model side is :mod:`rlplat.models.moe`).

``actor.moe.router_replay`` says which recorded routing a forward replays (fields of the batch, ``[B, P + R,
layers, top_k]``, ``-1`` where none was recorded):

* ``none``: every forward routes with its own routers;
* ``r2``: the actor's log-prob pass routes on its own and records its routing (``old_routed_experts``), which
  the update's forwards (and their recomputation under gradient checkpointing) replay;
* ``r3``: every forward (log-probs, the reference's, the update's) replays the rollout engine's routing
  (``routed_experts``).

A training forward (with gradients) records its routing for the load-balancing loss and the ``moe/*`` metrics,
among them, when the batch has the rollout's routing, ``moe/routing_mismatch_frac``: how often the experts it used
differ from the rollout's (0 under r3, by replay; under none, the rollout/training routing gap), and
``moe/router_mismatch_frac``: how often its routers' own choice does (under every mode: the gap that replay closes).
"""

from __future__ import annotations

import contextlib

from rlplat.engines.base import ForwardOutput
from rlplat.engines.packing import PackedBatch
from rlplat.engines.ulysses import local_tokens, whole_tokens
from rlplat.models.moe import (
    NO_ROUTING, RouterTap, Routing, load_balancing_loss, routing_metrics, routing_mismatch,
)

ROUTER_REPLAY = ("none", "r2", "r3")  # actor.moe.router_replay
ROLLOUT_ROUTING = "routed_experts"  # the batch field of the rollout engine's routing
OLD_ROUTING = "old_routed_experts"  # the actor's log-prob pass's (r2)


def router_loss_share(response_mask, num_tokens: float) -> float:
    """The weight of a micro-batch's router loss and metrics in its mini-batch's (of ``num_tokens`` response tokens,
    over the replicas): its share of the response tokens, so that the micro-batches' weighted values add up to the
    mini-batch's mean."""
    return float(response_mask.sum()) / max(num_tokens, 1.0)


class RoutedForward:
    """One engine's routing policy over its model's :class:`~rlplat.models.moe.RouterTap`: ``replay`` is
    ``actor.moe.router_replay``; ``trained`` says whether the engine trains (the actor) or only scores (the
    reference, which replays r3's routing and records nothing)."""

    def __init__(self, tap: RouterTap, replay: str, trained: bool):
        self.tap, self.replay, self.trained = tap, replay, trained

    @contextlib.contextmanager
    def own_routing(self):
        """Forwards inside route with the model's own routers, replaying nothing (sequences no rollout routed, such
        as the weight sync's probe or the engine's start-up check)."""
        replay, self.replay = self.replay, "none"
        try:
            yield
        finally:
            self.replay = replay

    def _replayed_field(self, grad: bool) -> str | None:
        if self.replay == "r3":
            return ROLLOUT_ROUTING
        return OLD_ROUTING if self.replay == "r2" and grad else None

    def records(self, grad: bool) -> bool:
        """A training forward, or (r2) the actor's log-prob pass."""
        return grad or (self.replay == "r2" and self.trained)

    @contextlib.contextmanager
    def around(self, rows: PackedBatch, tensors, grad: bool, sp_group=None):
        """Around one forward over ``rows`` (of the micro-batch ``tensors``): sets the routing to replay (kept
        after the forward, for a recomputation in the backward pass) and yields the :class:`Routing` it records
        (None when it records nothing). With Ulysses sequence parallelism (``sp_group``) this rank's model sees
        its slice of each row: it replays that slice of the routing."""
        field = self._replayed_field(grad)
        if field is not None and field not in tensors.keys():
            why = "the rollout engine did not return it" if field == ROLLOUT_ROUTING else "no log-prob pass recorded it"
            raise KeyError(f"actor.moe.router_replay={self.replay} replays the batch field {field!r}, which this "
                           f"batch lacks ({why})")
        self.tap.replay = rows.pack(tensors[field], NO_ROUTING) if field is not None else None
        if sp_group is not None and self.tap.replay is not None:
            self.tap.replay = local_tokens(self.tap.replay, rows.input_ids.shape[1], sp_group)
        with self.tap.recording() if self.records(grad) else contextlib.nullcontext() as routing:
            yield routing

    def finish(self, out: ForwardOutput, routing: Routing, rows: PackedBatch, tensors, grad: bool,
               sp_group=None) -> None:
        """Put what ``routing`` recorded into ``out``: the weighted load-balancing loss and the metrics (a training
        forward), or the routing itself in the batch's layout (r2's log-prob pass). With Ulysses (``sp_group``)
        the ranks' slices are joined first, on every rank (the logits keep their gradient: each rank's loss is
        the whole loss)."""
        tap = self.tap
        if sp_group is not None:
            shape = rows.input_ids.shape
            joined = lambda tensors: [whole_tokens(x, *shape, sp_group) for x in tensors]  # noqa: E731
            indices = joined(routing.indices)
            routing = Routing(joined(routing.logits), indices, joined(routing.own) if routing.replayed else indices)
        real = rows.real.to(routing.logits[0].device)
        if not grad:
            out.routed_experts = rows.unpack(routing.stacked(), tensors["input_ids"].shape[1], NO_ROUTING).cpu()
            return
        aux = load_balancing_loss(routing, real, tap.num_experts)
        out.router_loss = tap.aux_loss_coef * aux
        out.router_metrics = {"moe/aux_loss": float(aux.detach()), **routing_metrics(routing, real, tap.num_experts)}
        if ROLLOUT_ROUTING in tensors.keys():
            recorded = rows.pack(tensors[ROLLOUT_ROUTING], NO_ROUTING)
            used = routing_mismatch(routing.indices, real, recorded)
            out.router_metrics["moe/routing_mismatch_frac"] = used
            out.router_metrics["moe/router_mismatch_frac"] = routing_mismatch(routing.own, real, recorded) \
                if routing.replayed else used
