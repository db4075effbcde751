"""Mixture-of-experts models: their routers found, what each forward routed recorded, and the router's
load-balancing loss and metrics computed from it.

A sparse layer's router scores every token against every expert (``logits`` ``[tokens, experts]``), takes the
softmax, and sends the token to the ``top_k`` most probable experts (``indices`` ``[tokens, top_k]``), whose
outputs it mixes with those probabilities (renormalised over the chosen ones when the model says
``norm_topk_prob``). Transformers' softmax-top-k routers (``Qwen3MoeTopKRouter`` and the like) return
``(logits, weights, indices)``; :class:`RouterTap` records the logits and indices of each forward by layer.

Load-balancing loss (Switch Transformer: Fedus, Zoph & Shazeer, *Switch Transformers*, JMLR 2022, eq. 4;
in the form of transformers' ``load_balancing_loss_func``, so a model config's ``router_aux_loss_coef`` means
what it means there), over the real tokens of all sparse layers pooled::

    L_aux = E * sum_{s < k} sum_i f_{s,i} * P_i
    f_{s,i} = share of (token, layer) pairs whose s-th choice is expert i      (no gradient)
    P_i     = mean over (token, layer) of softmax(logits)_i                      (the gradient flows here)

1 per choice slot when routing is uniform (so ``k`` in all), larger when a few experts take most tokens.

Routing replay (``actor.moe.router_replay``; R3: Ma et al., *Stabilizing MoE Reinforcement Learning by Aligning
Training and Inference Routers*, arXiv 2510.23027): a forward given the experts each token was routed to
elsewhere (by the rollout engine, or by the actor's log-prob pass) sends the token to those experts instead of
its router's own top-k; the gate weights are still the router's probabilities of the chosen experts
(renormalised as the model does), so the router keeps its gradient and keeps learning. Tokens without recorded
routing (``-1``: padding, an agent's observation tokens, the last sampled token) use the router's own choice.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def num_experts(config) -> int:
    """The routed experts per sparse layer of a model config (0 for a dense model)."""
    return int(getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None) or 0)


def sparse_layers(config) -> tuple[int, ...]:
    """The layers of a model config whose MLP is the routed experts (Qwen-MoE's rule: every
    ``decoder_sparse_step``-th layer but those in ``mlp_only_layers``; none for a dense model)."""
    if not num_experts(config):
        return ()
    step = getattr(config, "decoder_sparse_step", None) or 1
    dense = set(getattr(config, "mlp_only_layers", None) or ())
    return tuple(i for i in range(config.num_hidden_layers) if i not in dense and (i + 1) % step == 0)


def is_moe(config) -> bool:
    """Whether a model config (or an embedded model's spec) describes a mixture of experts."""
    return config is not None and num_experts(config) > 0


def find_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The softmax-top-k routers of ``model``'s sparse layers, in layer order (modules whose class name ends
    in ``TopKRouter`` with ``top_k`` and ``num_experts``, as transformers' MoE models have)."""
    return [m for m in model.modules() if type(m).__name__.lower().endswith("topkrouter")
            and hasattr(m, "top_k") and hasattr(m, "num_experts")]


NO_ROUTING = -1  # a token without recorded routing (in a routed_experts field)


@dataclass
class Routing:
    """What the sparse layers of one forward routed, per layer, tokens in the order of the flattened input rows:
    the router's logits ``[tokens, experts]``, the experts the tokens went to ``[tokens, top_k]`` (the
    router's own top-k, or the replayed routing) and the router's own top-k (``own``; the same tensors as
    ``indices`` where nothing was replayed)."""

    logits: list[torch.Tensor]
    indices: list[torch.Tensor]
    own: list[torch.Tensor]

    @classmethod
    def empty(cls, layers: int) -> Routing:
        return cls([None] * layers, [None] * layers, [None] * layers)

    @property
    def replayed(self) -> bool:
        """Whether some layer went to other experts than its router's own choice (else ``own`` is ``indices``)."""
        return any(own is not used for own, used in zip(self.own, self.indices))

    def stacked(self) -> torch.Tensor:
        """The experts the tokens went to, ``[tokens, layers, top_k]`` int16 (a routed_experts field's layout)."""
        return torch.stack(self.indices, dim=1).to(torch.int16)


class RouterTap:
    """Forward hooks on a model's routers that record a :class:`Routing` while :meth:`recording` is open
    (and not otherwise: a gradient-checkpointed layer that runs its forward again in the backward pass adds
    nothing), and that replay :attr:`replay` while it is set: ``[tokens, layers, top_k]`` experts in the order of
    the flattened input rows, ``-1`` where the router chooses (kept until changed, so a checkpointed layer's
    recomputation in the backward pass routes as its forward did)."""

    def __init__(self, model: torch.nn.Module, aux_loss_coef: float):
        self.routers = find_routers(model)
        if not self.routers:
            raise ValueError(f"{type(model).__name__} has no softmax-top-k router (a module whose class name ends "
                             f"in TopKRouter): rlplat's mixture-of-experts support does not know its routing")
        self.num_experts, self.top_k = self.routers[0].num_experts, self.routers[0].top_k
        self.aux_loss_coef = aux_loss_coef
        # per router, whether its gate weights are its chosen experts' softmax probabilities renormalised over them
        # (Qwen's norm_topk_prob, Mixtral, softmax over the top-k logits) or as they are; read off its first output
        self._renormalises: list[bool | None] = [None] * len(self.routers)
        self.replay: torch.Tensor | None = None
        self._routing: Routing | None = None
        for layer, router in enumerate(self.routers):
            router.register_forward_hook(self._hook(layer))

    @classmethod
    def of(cls, model: torch.nn.Module, moe_cfg) -> RouterTap | None:
        """A tap on ``model``'s routers when it is a mixture of experts (None for a dense model), its loss
        coefficient ``moe_cfg.aux_loss_coef`` (``actor.moe``) or, when that is None, the model config's
        ``router_aux_loss_coef``."""
        if not is_moe(model.config):
            return None
        coef = moe_cfg.aux_loss_coef
        return cls(model, float(getattr(model.config, "router_aux_loss_coef", 0.0) if coef is None else coef))

    def _hook(self, layer: int):
        def record(module, args, output):
            logits, weights, own = output
            indices = own
            if self._renormalises[layer] is None:
                self._renormalises[layer] = self._gates_of(module, logits, weights, own)
            if self.replay is not None:
                indices, weights = self._replayed(layer, logits, own, self.replay[:, layer].to(own.device))
            if self._routing is not None:
                routing = self._routing
                routing.logits[layer], routing.indices[layer], routing.own[layer] = logits, indices, own
            return logits, weights, indices
        return record

    @staticmethod
    def _gates_of(router: torch.nn.Module, logits: torch.Tensor, weights: torch.Tensor, own: torch.Tensor) -> bool:
        """Whether ``router``'s gate ``weights`` are the softmax probabilities of its ``own`` experts renormalised
        over them (True) or as they are (False); ValueError for a router whose gates are neither (e.g. sigmoid
        scores): its load-balancing loss and replay would be wrong."""
        with torch.no_grad():
            probs = F.softmax(logits, dim=-1, dtype=torch.float).gather(-1, own)
            tolerance = 1e-4 if weights.dtype == torch.float32 else 2e-2
            for renormalised, expected in ((True, probs / probs.sum(-1, keepdim=True)), (False, probs)):
                if torch.allclose(weights.float(), expected, atol=tolerance, rtol=0):
                    return renormalised
        raise ValueError(f"{type(router).__name__}'s gate weights are not the softmax probabilities of the experts "
                         f"it chooses: rlplat's mixture-of-experts support (load-balancing loss, routing replay) "
                         f"covers softmax top-k routers only")

    def _replayed(self, layer: int, logits: torch.Tensor, own: torch.Tensor, chosen: torch.Tensor):
        """The experts ``chosen`` ``[tokens, top_k]`` (``-1``: the router's ``own``) and their gate weights: the
        router's softmax probabilities of them, renormalised over them when the router does."""
        if chosen.shape != own.shape:
            raise ValueError(f"replayed routing has {tuple(chosen.shape)} entries for a layer that routed "
                             f"{tuple(own.shape)} (tokens, top_k)")
        indices = torch.where(chosen >= 0, chosen.long(), own)
        weights = F.softmax(logits, dim=-1, dtype=torch.float).gather(-1, indices)
        if self._renormalises[layer]:
            weights = weights / weights.sum(-1, keepdim=True)
        return indices, weights.to(logits.dtype)

    @contextlib.contextmanager
    def recording(self):
        """Yields the :class:`Routing` the forwards inside fill (each layer's last call)."""
        self._routing = Routing.empty(len(self.routers))
        try:
            yield self._routing
        finally:
            self._routing = None


def checkpoint_layout(bucket: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """Weights under the names and shapes of a Hugging Face checkpoint, which vLLM's and SGLang's ``load_weights``
    read: transformers (5.x) holds a layer's experts fused, ``mlp.experts.gate_up_proj`` ``[E, 2I, H]`` and
    ``mlp.experts.down_proj`` ``[E, H, I]``, where checkpoints keep one tensor per expert and projection
    (``mlp.experts.{e}.gate_proj.weight`` ``[I, H]``, ``up_proj``, ``down_proj`` ``[H, I]``). Other weights pass
    as they are (views: nothing is copied)."""
    out = []
    for name, tensor in bucket:
        prefix, _, kind = name.rpartition(".experts.")
        if kind == "gate_up_proj" and tensor.dim() == 3:
            gate, up = tensor.chunk(2, dim=1)
            for e in range(tensor.shape[0]):
                out += [(f"{prefix}.experts.{e}.gate_proj.weight", gate[e]),
                        (f"{prefix}.experts.{e}.up_proj.weight", up[e])]
        elif kind == "down_proj" and tensor.dim() == 3:
            out += [(f"{prefix}.experts.{e}.down_proj.weight", tensor[e]) for e in range(tensor.shape[0])]
        else:
            out.append((name, tensor))
    return out


def load_balancing_loss(routing: Routing, real: torch.Tensor, num_experts: int) -> torch.Tensor:
    """``L_aux`` of the module docstring over the tokens where ``real`` (``[tokens]`` bool) is set."""
    probs = torch.cat([F.softmax(logits[real].float(), dim=-1) for logits in routing.logits])  # [layers*T, E]
    chosen = torch.cat([F.one_hot(indices[real], num_experts) for indices in routing.indices]).float()  # [L*T, k, E]
    return num_experts * (chosen.mean(0) * probs.mean(0)[None]).sum()


def routing_mismatch(indices: list[torch.Tensor], real: torch.Tensor, recorded: torch.Tensor) -> float:
    """The share of (token, layer) pairs, over the real tokens with a recorded routing (``recorded`` ``[tokens,
    layers, top_k]``, e.g. the rollout engine's), where the experts ``indices`` (per layer ``[tokens, top_k]``: those a
    forward used, ``moe/routing_mismatch_frac``, or its routers' own choice, ``moe/router_mismatch_frac``) are not the
    recorded set; 0 when no token has one (so every micro-batch reports it)."""
    with torch.no_grad():
        used = torch.stack(indices, dim=1).sort(-1).values  # [tokens, layers, k]
        recorded = recorded.to(used.device).long().sort(-1).values
        held = real[:, None] & (recorded >= 0).all(-1)  # [tokens, layers]
        if not bool(held.any()):
            return 0.0
        return float((used != recorded).any(-1)[held].float().mean())


def routing_metrics(routing: Routing, real: torch.Tensor, num_experts: int) -> dict[str, float]:
    """Of one forward's real tokens: ``moe/expert_load_max_frac``, the busiest expert's share of a layer's
    routed (token, choice) pairs, the largest over layers (1/E when balanced; 1/k when one expert takes every
    token); ``moe/routing_entropy``, the router distribution's entropy in nats, averaged over tokens and layers
    (ln E when uniform)."""
    with torch.no_grad():
        loads, entropies = [], []
        for logits, indices in zip(routing.logits, routing.indices):
            counts = torch.bincount(indices[real].reshape(-1), minlength=num_experts).float()
            loads.append(counts.max() / counts.sum().clamp(min=1))
            log_p = F.log_softmax(logits[real].float(), dim=-1)
            entropies.append(-(log_p.exp() * log_p).sum(-1).mean())
        return {"moe/expert_load_max_frac": float(torch.stack(loads).max()),
                "moe/routing_entropy": float(torch.stack(entropies).mean())}
