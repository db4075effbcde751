"""A Megatron-Core mixture of experts' routing: recorded and replayed through Megatron-Core's ``RouterReplay``
hook, for :class:`rlplat.engines.routing.RoutedForward` (the policy: what to replay, what to record, the
load-balancing loss and the ``moe/*`` metrics, as on the FSDP engine).

Megatron-Core's ``TopKRouter`` hands its top-k choice to the ``RouterReplay`` object it holds
(``topk_routing_with_score_function``); each router here holds a :class:`LayerReplay`, which takes the router's own
top-k, replaces it by the replayed experts where a token has some (``-1``: the router's own choice), gathers the
scores of the experts used (so the gates are the router's probabilities of them: renormalised over them for
Qwen3-MoE, where the softmax runs over the chosen logits) and records what it used. Megatron-Core's own replay
actions take every token's experts from the recording, which a padded or observation token does not have.

Megatron-Core runs a micro-batch sequence first (``[T, B]``): :class:`SequenceFirstRows` is the batch layout the
routing is kept in. With sequence parallelism each tensor-parallel rank routes its slice of the sequence: it
replays its slice of the routing, and what the ranks recorded is joined (the logits with their gradient, each rank
keeping its own slice's in backward) so that the loss and the metrics see the whole micro-batch on every rank.

With pipeline parallelism each stage routes its own layers, and with recomputed activations the forward that
builds a layer's graph is the one the backward pass runs again: neither can take the load-balancing loss from the
recorded logits of a whole forward. :class:`CountedRouting` serves both. The loss pools the layers
(``L_aux = E / L^2 * sum f_total * P_total``, the layers' sums over every stage); its gradient on one layer's router,
``E / L^2 * sum f_total * P_layer``, needs every layer's expert counts ``f`` first. A forward-only pass of the
mini-batch through the schedule (routing as the update's forward will: the same replay, the same weights) gives
each micro-batch's counts and metrics, summed over the stages; in the update each router adds its term to its
logits' backward, weighted by the micro-batch's share of the response tokens (as Megatron-Core's
``MoEAuxLossAutoScaler`` adds its loss to the activations), in whichever forward runs with gradients.
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.distributed as dist
import torch.nn.functional as F

from rlplat.engines.routing import ROLLOUT_ROUTING, router_loss_share
from rlplat.models.moe import NO_ROUTING, Routing


class SequenceFirstRows:
    """A padded micro-batch's tokens in Megatron-Core's order: position ``t`` of row ``b`` is token ``t * B + b``,
    over the ``run`` positions the micro-batch runs at (its length, or more with sequence parallelism: the extra
    positions are padding). The layout :class:`rlplat.engines.routing.RoutedForward` keeps routing in."""

    def __init__(self, attention_mask: torch.Tensor, run: int):
        self.rows, self.run = attention_mask.shape[0], run
        self.real = self.pack(attention_mask.bool(), False)

    def pack(self, tensor: torch.Tensor, fill) -> torch.Tensor:
        """``[B, T, ...]`` -> ``[run * B, ...]`` (positions past ``T`` hold ``fill``)."""
        extra = self.run - tensor.shape[1]
        if extra:
            tensor = torch.cat([tensor, tensor.new_full((self.rows, extra, *tensor.shape[2:]), fill)], dim=1)
        return tensor.transpose(0, 1).reshape(-1, *tensor.shape[2:])

    def unpack(self, tensor: torch.Tensor, length: int, fill) -> torch.Tensor:
        """``[run * B, ...]`` -> ``[B, length, ...]``: padding positions hold ``fill``, those past ``length`` are
        dropped."""
        tensor = torch.where(self.real.reshape(-1, *[1] * (tensor.dim() - 1)).to(tensor.device), tensor, fill)
        return tensor.reshape(self.run, self.rows, *tensor.shape[1:]).transpose(0, 1)[:, :length]


@functools.cache
def layer_replay_class():
    """:class:`LayerReplay`, defined once, on first use (it subclasses Megatron-Core's ``RouterReplay``, which imports
    Megatron-Core)."""
    from megatron.core.transformer.moe.router_replay import RouterReplay

    class LayerReplay(RouterReplay):
        """One router's replay and recording, driven by its :class:`MegatronRouterTap` rather than by
        ``RouterReplay``'s class-wide actions."""

        def __init__(self, tap: MegatronRouterTap, layer: int):
            super().__init__()
            RouterReplay.global_router_replay_instances.remove(self)  # the tap drives it; no class-wide reference
            self.tap, self.layer = tap, layer

        def get_replay_topk(self, scores, topk, num_groups=None, group_topk=None, default_compute_topk=None):
            values, own = default_compute_topk(scores, topk, num_groups=num_groups, group_topk=group_topk)
            indices, chosen = own, self.tap.replayed(self.layer, own)
            if chosen is not None:
                indices = torch.where(chosen >= 0, chosen, own)
                values = scores.gather(1, indices)
            self.record_indices(indices)
            self.tap.record(self.layer, indices=indices, own=own)
            return values, indices

    return LayerReplay


class MegatronRouterTap:
    """The routers of a Megatron-Core ``GPTModel``'s sparse layers, with what :class:`RoutedForward` needs of a tap
    (as :class:`rlplat.models.moe.RouterTap` for transformers' models): ``replay`` (``[run * B, layers, top_k]`` in
    :class:`SequenceFirstRows` order, kept until changed, so a recomputed layer replays what its forward did),
    :meth:`recording`, ``num_experts``, ``aux_loss_coef``."""

    def __init__(self, model: torch.nn.Module, aux_loss_coef: float, tp_group=None, sequence_parallel: bool = False,
                 pp_group=None):
        from megatron.core.transformer.moe.router import TopKRouter

        self.routers = [m for m in model.modules() if isinstance(m, TopKRouter)]
        self.num_experts, self.top_k = self.routers[0].config.num_moe_experts, self.routers[0].topk
        # this stage's routers among all stages' (a routing field's layers): the first of them, and how many in all
        self.first_layer, self.num_layers = 0, len(self.routers)
        if pp_group is not None and dist.get_world_size(pp_group) > 1:
            counts = [None] * dist.get_world_size(pp_group)
            dist.all_gather_object(counts, len(self.routers), group=pp_group)
            self.first_layer, self.num_layers = sum(counts[:dist.get_rank(pp_group)]), sum(counts)
        self.aux_loss_coef = aux_loss_coef
        self.tp_group, self.sequence_parallel = tp_group, sequence_parallel
        self.replay: torch.Tensor | None = None
        self.term = None  # logits -> a router's term of the load-balancing loss (CountedRouting.begin)
        self._routing: Routing | None = None
        replay_class = layer_replay_class()
        for layer, router in enumerate(self.routers):
            router.router_replay = replay_class(self, layer)
            router.gating = self._recorded_gating(router.gating, layer)

    def _recorded_gating(self, gating, layer: int):
        def recorded(input):
            logits = gating(input)
            self.record(layer, logits=logits.reshape(-1, self.num_experts))
            if self.term is not None and torch.is_grad_enabled():  # the forward whose graph the backward runs
                logits = _AddsGradient.apply(logits, self.term(logits.reshape(-1, self.num_experts)))
            return logits
        return recorded

    def local(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's tokens of a whole micro-batch's ``tensor`` (sequence first): with sequence parallelism its
        slice of the sequence, a contiguous share of the tokens."""
        if not self.sequence_parallel:
            return tensor
        return tensor.chunk(dist.get_world_size(self.tp_group))[dist.get_rank(self.tp_group)]

    def replayed(self, layer: int, own: torch.Tensor) -> torch.Tensor | None:
        """The experts ``layer`` replays for this rank's tokens (``-1``: its own choice), or None."""
        if self.replay is None:
            return None
        chosen = self.local(self.replay)[:, self.first_layer + layer].to(own.device, torch.long)
        if chosen.shape != own.shape:
            raise ValueError(f"replayed routing has {tuple(chosen.shape)} entries for a layer that routed "
                             f"{tuple(own.shape)} (tokens, top_k)")
        return chosen

    def record(self, layer: int, logits: torch.Tensor | None = None, indices: torch.Tensor | None = None,
               own: torch.Tensor | None = None) -> None:
        if self._routing is not None:
            if logits is not None:
                self._routing.logits[layer] = logits
            if indices is not None:
                self._routing.indices[layer], self._routing.own[layer] = indices, own

    @contextlib.contextmanager
    def recording(self):
        """Yields the :class:`Routing` the forwards inside fill, over the whole micro-batch once the block ends."""
        routing = self._routing = Routing.empty(len(self.routers))
        try:
            yield routing
        finally:
            self._routing = None
        if self.sequence_parallel:
            from megatron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region

            routing.logits = [gather_from_sequence_parallel_region(t, tensor_parallel_output_grad=False)
                              for t in routing.logits]
            replayed = routing.replayed
            routing.indices = [gather_from_sequence_parallel_region(t) for t in routing.indices]
            routing.own = ([gather_from_sequence_parallel_region(t) for t in routing.own] if replayed
                           else routing.indices)


class _AddsGradient(torch.autograd.Function):
    """``output`` as it is; in backward ``loss`` also gets the gradient 1: a term of the loss added where it is
    computed, not through the last stage's loss (Megatron-Core's ``MoEAuxLossAutoScaler`` does the same)."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, loss: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(loss)
        return output

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (loss,) = ctx.saved_tensors
        return grad, torch.ones_like(loss)


class _RoutesAgain(torch.autograd.Function):
    """``output`` as it is; in backward, before the gradient reaches the layers (and the layers recomputed there),
    the tap is set back to replay and add the terms of the forward that made ``output``: a pipeline stage runs other
    micro-batches' forwards between a micro-batch's forward and its backward."""

    @staticmethod
    def forward(ctx, output: torch.Tensor, tap: MegatronRouterTap, state) -> torch.Tensor:
        ctx.tap, ctx.state = tap, state
        return output.view_as(output)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        ctx.tap.replay, ctx.tap.term = ctx.state
        return grad, None, None


class CountedRouting:
    """The routers' loss and metrics from a counting pass (the module docstring): with pipeline stages, or with
    recomputed activations. The engine runs :meth:`collect` after each forward of the counting pass, then
    :meth:`count`; :meth:`begin` before each of the update's forwards (a forward without gradients adds no term),
    :meth:`routes_again` on each of their outputs. With stages, :meth:`keep` and
    :meth:`joined_records` join the stages' recorded layers for r2's log-prob pass."""

    def __init__(self, tap: MegatronRouterTap, pp_group):
        self.tap, self.pp_group = tap, pp_group
        self._sums: list[torch.Tensor] = []  # per micro-batch of the counting pass: this stage's sums
        self._counted: list[tuple[torch.Tensor, dict[str, float], float]] = []  # (f over all layers, metrics, share)
        self._records: list[torch.Tensor] = []
        self.metrics: dict[str, float] | None = None  # the update's current micro-batch's

    def _stage_sums(self, routing: Routing, rows: SequenceFirstRows, tensors) -> torch.Tensor:
        """This stage's layers' sums for one micro-batch, float64: ``f`` ``[k * E]`` (each layer's share of the
        real tokens whose s-th choice is each expert), ``P`` ``[E]`` (the mean router probabilities), the routing
        entropy, the (token, layer) pairs that went to / whose router chose other experts than the rollout's and
        the pairs with a rollout routing, and the busiest expert's share (its max over stages is taken apart)."""
        tap, real = self.tap, rows.real.to(routing.logits[0].device)
        f = sum(F.one_hot(i[real], tap.num_experts).double().mean(0) for i in routing.indices)
        probs = [F.softmax(logits[real].double(), dim=-1) for logits in routing.logits]
        entropy = sum(-(p * p.clamp(min=1e-30).log()).sum(-1).mean() for p in probs)
        load = max(float(torch.bincount(i[real].reshape(-1), minlength=tap.num_experts).max()) / max(i[real].numel(), 1)
                   for i in routing.indices)
        mismatch = [0.0] * 4
        if ROLLOUT_ROUTING in tensors.keys():
            layers = slice(tap.first_layer, tap.first_layer + len(tap.routers))
            recorded = rows.pack(tensors[ROLLOUT_ROUTING], NO_ROUTING)[:, layers].to(real.device).long().sort(-1).values
            held = real[:, None] & (recorded >= 0).all(-1)
            for j, chosen in enumerate((routing.indices, routing.own)):
                other = (torch.stack(chosen, dim=1).sort(-1).values != recorded).any(-1)
                mismatch[2 * j: 2 * j + 2] = [float((other & held).sum()), float(held.sum())]
        return torch.cat([f.reshape(-1), sum(p.mean(0) for p in probs),
                          torch.tensor([float(entropy), *mismatch, load], dtype=torch.float64, device=real.device)])

    def collect(self, output: torch.Tensor, routed) -> torch.Tensor:
        """After a forward of the counting pass (``routed``: the engine's (routing, rows, tensors)): keep its sums."""
        self._sums.append(self._stage_sums(*routed))
        return output

    def count(self, micros: list, num_tokens: float) -> None:
        """After the counting pass over ``micros`` (a mini-batch of ``num_tokens`` response tokens over the
        replicas): each micro-batch's expert counts and metrics over all stages, for the update's forwards."""
        sums, self._sums = torch.stack(self._sums), []
        load = sums[:, -1].clone()
        if self.pp_group is not None and dist.get_world_size(self.pp_group) > 1:
            dist.all_reduce(sums, group=self.pp_group)
            dist.all_reduce(load, op=dist.ReduceOp.MAX, group=self.pp_group)
        tap, experts = self.tap, self.tap.num_experts
        layers, k = tap.num_layers, tap.top_k
        self._counted = []
        for row, busiest, micro in zip(sums.cpu(), load.tolist(), micros):
            f, p = row[:k * experts].reshape(k, experts), row[k * experts: (k + 1) * experts]
            entropy, other, held, other_own, held_own = row[(k + 1) * experts:-1].tolist()
            metrics = {"moe/aux_loss": float(experts / layers ** 2 * (f * p).sum()),
                       "moe/expert_load_max_frac": busiest, "moe/routing_entropy": entropy / layers}
            if ROLLOUT_ROUTING in micro.tensors.keys():
                metrics["moe/routing_mismatch_frac"] = other / held if held else 0.0
                metrics["moe/router_mismatch_frac"] = other_own / held_own if held_own else 0.0
            share = router_loss_share(micro.tensors["response_mask"], num_tokens)
            self._counted.append((f, metrics, share))

    def begin(self, rows: SequenceFirstRows) -> None:
        """Before this stage's forward of the update's next micro-batch (``rows``): each router's term of the
        weighted loss, ``coef * share * E / L^2 * sum f * P_layer`` over the rank's real tokens (their share of
        the micro-batch's: with sequence parallelism the ranks' terms add up); its metrics for the last stage."""
        tap = self.tap
        if not self._counted:
            raise RuntimeError("a training forward of a mixture of experts over pipeline stages or with recomputed "
                               "activations runs in train_mini_batch, after its counting pass")
        f, self.metrics, share = self._counted.pop(0)
        real = rows.real
        local, scale = tap.local(real), tap.aux_loss_coef * share * tap.num_experts / tap.num_layers ** 2
        weights = f.sum(0) * scale / max(int(real.sum()), 1)  # [E]: the no-gradient factor of each expert

        def term(logits: torch.Tensor) -> torch.Tensor:
            probs = F.softmax(logits[local.to(logits.device)].float(), dim=-1)
            return (probs.sum(0) * weights.to(probs)).sum()

        tap.term = term

    def routes_again(self, output: torch.Tensor) -> torch.Tensor:
        """``output`` of an update's forward, whose backward recomputes with this forward's replay and terms."""
        return _RoutesAgain.apply(output, self.tap, (self.tap.replay, self.tap.term))

    def keep(self, output: torch.Tensor, routed) -> torch.Tensor:
        """After a stage's forward in r2's log-prob pass: keep what its layers routed (``[B, T, layers here, k]``)."""
        routing, rows, tensors = routed
        self._records.append(rows.unpack(routing.stacked(), tensors["input_ids"].shape[1], NO_ROUTING).cpu())
        return output

    def joined_records(self) -> list[torch.Tensor]:
        """Each micro-batch of the pass's routing over all stages' layers (:meth:`keep`; on every stage)."""
        stages = [None] * dist.get_world_size(self.pp_group)
        dist.all_gather_object(stages, self._records, group=self.pp_group)
        self._records = []
        return [torch.cat(parts, dim=2) for parts in zip(*stages)]
