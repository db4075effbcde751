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
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F


def num_experts(config) -> int:
    """The routed experts per sparse layer of a model config (0 for a dense model)."""
    return int(getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None) or 0)


def is_moe(config) -> bool:
    """Whether a model config (or an embedded model's spec) describes a mixture of experts."""
    return config is not None and num_experts(config) > 0


def find_routers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The softmax-top-k routers of ``model``'s sparse layers, in layer order (modules whose class name ends
    in ``TopKRouter`` with ``top_k`` and ``num_experts``, as transformers' MoE models have)."""
    return [m for m in model.modules() if type(m).__name__.lower().endswith("topkrouter")
            and hasattr(m, "top_k") and hasattr(m, "num_experts")]


@dataclass
class Routing:
    """What the sparse layers of one forward routed: per layer, the router's logits ``[tokens, experts]`` and
    the chosen experts ``[tokens, top_k]``, tokens in the order of the flattened input rows."""

    logits: list[torch.Tensor]
    indices: list[torch.Tensor]


class RouterTap:
    """Forward hooks on a model's routers that record a :class:`Routing` while :meth:`recording` is open
    (and not otherwise: a gradient-checkpointed layer that runs its forward again in the backward pass adds
    nothing)."""

    def __init__(self, model: torch.nn.Module, aux_loss_coef: float):
        self.routers = find_routers(model)
        if not self.routers:
            raise ValueError(f"{type(model).__name__} has no softmax-top-k router (a module whose class name ends "
                             f"in TopKRouter): rlplat's mixture-of-experts support does not know its routing")
        self.num_experts, self.top_k = self.routers[0].num_experts, self.routers[0].top_k
        self.aux_loss_coef = aux_loss_coef
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
        def record(module, args, output) -> None:
            if self._routing is not None:
                logits, _, indices = output
                self._routing.logits[layer], self._routing.indices[layer] = logits, indices
        return record

    @contextlib.contextmanager
    def recording(self):
        """Yields the :class:`Routing` the forwards inside fill (each layer's last call)."""
        self._routing = Routing([None] * len(self.routers), [None] * len(self.routers))
        try:
            yield self._routing
        finally:
            self._routing = None


def load_balancing_loss(routing: Routing, real: torch.Tensor, num_experts: int) -> torch.Tensor:
    """``L_aux`` of the module docstring over the tokens where ``real`` (``[tokens]`` bool) is set."""
    probs = torch.cat([F.softmax(logits[real].float(), dim=-1) for logits in routing.logits])  # [layers*T, E]
    chosen = torch.cat([F.one_hot(indices[real], num_experts) for indices in routing.indices]).float()  # [L*T, k, E]
    return num_experts * (chosen.mean(0) * probs.mean(0)[None]).sum()


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
