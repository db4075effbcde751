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
"""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.distributed as dist

from rlplat.models.moe import Routing


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

    def __init__(self, model: torch.nn.Module, aux_loss_coef: float, tp_group=None, sequence_parallel: bool = False):
        from megatron.core.transformer.moe.router import TopKRouter

        self.routers = [m for m in model.modules() if isinstance(m, TopKRouter)]
        self.num_experts, self.top_k = self.routers[0].config.num_moe_experts, self.routers[0].topk
        self.aux_loss_coef = aux_loss_coef
        self.tp_group, self.sequence_parallel = tp_group, sequence_parallel
        self.replay: torch.Tensor | None = None
        self._routing: Routing | None = None
        replay_class = layer_replay_class()
        for layer, router in enumerate(self.routers):
            router.router_replay = replay_class(self, layer)
            router.gating = self._recorded_gating(router.gating, layer)

    def _recorded_gating(self, gating, layer: int):
        def recorded(input):
            logits = gating(input)
            self.record(layer, logits=logits.reshape(-1, self.num_experts))
            return logits
        return recorded

    def _local(self, tensor: torch.Tensor) -> torch.Tensor:
        """This rank's tokens of a whole micro-batch's ``tensor`` (sequence first): with sequence parallelism its
        slice of the sequence, a contiguous share of the tokens."""
        if not self.sequence_parallel:
            return tensor
        return tensor.chunk(dist.get_world_size(self.tp_group))[dist.get_rank(self.tp_group)]

    def replayed(self, layer: int, own: torch.Tensor) -> torch.Tensor | None:
        """The experts ``layer`` replays for this rank's tokens (``-1``: its own choice), or None."""
        if self.replay is None:
            return None
        chosen = self._local(self.replay)[:, layer].to(own.device, torch.long)
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
