"""The gated MLP of Llama-style decoders, ``down(silu(gate(x)) * up(x))``, keeping half as much for the
backward pass.

Autograd keeps four ``[tokens, ffn]`` tensors of this block per layer until the backward pass: ``gate(x)``,
``silu(gate(x))``, ``up(x)`` and their product (the input of ``down``). With the feed-forward width 3-5x
the hidden width, they are the largest activations of a training forward pass. :class:`_SiluMulDown`
keeps only ``gate(x)`` and ``up(x)`` and recomputes ``silu`` and the product in the backward pass: two
elementwise operations over ``[tokens, ffn]``, next to the block's three ``tokens x hidden x ffn``
matmuls. Its gradients come from the same kernels as autograd's (tests/engines/test_gated_mlp.py compares
them). The recomputation is that of fused SwiGLU kernels (Liger Kernel's ``LigerSiLUMulFunction``: Hsu et
al. 2024, arXiv:2410.10989), here with the ``down`` projection folded in so that the product is not kept
either. SwiGLU itself: Shazeer 2020, "GLU Variants Improve Transformer", arXiv:2002.05202.

:func:`install_gated_mlp` puts a :class:`GatedMLP` in the place of each such block of a model, through the
module tree (``setattr`` on its parent). The new module holds the block's own ``gate_proj``, ``up_proj`` and
``down_proj`` layers under those names, so the parameters (the same objects), their names and therefore the
state dict, checkpoints, export and weight sync stay as they are. Replacing the module, rather than an
instance's ``forward`` or ``__class__``, keeps every object what it says it is: the model simply holds a
different, ordinary module there, visible in ``print(model)``, and the block that was replaced is not
altered. It is installed only for model types whose MLP is exactly this block, and only where the block
holds nothing else. With LoRA adapters on its layers (:mod:`rlplat.engines.lora`, without dropout on the
down projection's), :class:`_SiluMulDownLoRA` adds the down projection's adapter in the same way.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from rlplat.engines.lora import ADAPTER, adapted

#: model types whose decoder MLP is ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``
GATED_MLP_MODELS = frozenset({"llama", "qwen2", "qwen3", "mistral", "olmo2", "smollm3"})


class _SiluMulDown(torch.autograd.Function):
    """``(g, u, w_down) -> (silu(g) * u) @ w_down.T``, keeping ``g`` and ``u`` (not the product)."""

    @staticmethod
    def forward(ctx, gate, up, weight):
        ctx.save_for_backward(gate, up, weight)
        return F.linear(F.silu(gate) * up, weight)

    @staticmethod
    def backward(ctx, grad_out):
        gate, up, weight = ctx.saved_tensors
        act = F.silu(gate)
        grad_weight = None
        if ctx.needs_input_grad[2]:
            product = act * up
            grad_weight = grad_out.reshape(-1, grad_out.shape[-1]).T @ product.reshape(-1, product.shape[-1])
            del product
        grad_product = grad_out @ weight
        grad_up = grad_product * act if ctx.needs_input_grad[1] else None
        del act
        grad_gate = torch.ops.aten.silu_backward(grad_product * up, gate) if ctx.needs_input_grad[0] else None
        return grad_gate, grad_up, grad_weight


class _SiluMulDownLoRA(torch.autograd.Function):
    """``(g, u, W, A, B, s) -> p @ W.T + s (p @ A.T) @ B.T`` with ``p = silu(g) * u``: the down projection with a
    LoRA adapter (:mod:`rlplat.engines.lora`), keeping ``g`` and ``u`` as :class:`_SiluMulDown` does (and not
    ``p @ A.T`` either: recomputed, [tokens, r])."""

    @staticmethod
    def forward(ctx, gate, up, weight, lora_a, lora_b, scaling: float):
        ctx.save_for_backward(gate, up, weight, lora_a, lora_b)
        ctx.scaling = scaling
        product = F.silu(gate) * up
        return F.linear(product, weight) + scaling * F.linear(F.linear(product, lora_a), lora_b)

    @staticmethod
    def backward(ctx, grad_out):
        gate, up, weight, lora_a, lora_b = ctx.saved_tensors
        s = ctx.scaling
        act = F.silu(gate)
        product = act * up
        flat_grad, flat_product = grad_out.reshape(-1, grad_out.shape[-1]), product.reshape(-1, product.shape[-1])
        grad_low = grad_out @ lora_b  # [..., r]: the gradient of (p @ A.T), over s
        grad_weight = flat_grad.T @ flat_product if ctx.needs_input_grad[2] else None
        grad_a = s * grad_low.reshape(-1, grad_low.shape[-1]).T @ flat_product if ctx.needs_input_grad[3] else None
        grad_b = s * flat_grad.T @ (flat_product @ lora_a.T) if ctx.needs_input_grad[4] else None
        del product, flat_product
        grad_product = grad_out @ weight + s * (grad_low @ lora_a)
        grad_up = grad_product * act if ctx.needs_input_grad[1] else None
        del act
        grad_gate = torch.ops.aten.silu_backward(grad_product * up, gate) if ctx.needs_input_grad[0] else None
        return grad_gate, grad_up, grad_weight, grad_a, grad_b, None


def _linear(part) -> bool:
    """A plain linear layer, or one with a LoRA adapter (:mod:`rlplat.engines.lora`) over a plain one."""
    return type(part) is torch.nn.Linear or (hasattr(part, "lora_A") and type(getattr(part, "base_layer", None)) is torch.nn.Linear)


def _without_dropout(part) -> bool:
    """No dropout before a LoRA adapter (the fused down projection reads the product once for both paths)."""
    dropout = getattr(part, "lora_dropout", {})
    return all(isinstance(d, torch.nn.Identity) for d in dropout.values())


class GatedMLP(torch.nn.Module):
    """``down_proj(silu(gate_proj(x)) * up_proj(x))`` through :class:`_SiluMulDown`, with the layers of the block
    it replaces."""

    def __init__(self, gate_proj: torch.nn.Linear, up_proj: torch.nn.Linear, down_proj: torch.nn.Linear):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj

    @classmethod
    def from_module(cls, mlp: torch.nn.Module) -> GatedMLP:
        replacement = cls(mlp.gate_proj, mlp.up_proj, mlp.down_proj)
        replacement.train(mlp.training)
        return replacement

    @staticmethod
    def fits(module: torch.nn.Module) -> bool:
        """Whether ``module`` is exactly this block: three linear layers (``down_proj`` without bias) and SiLU,
        and nothing else that holds a tensor (so the replacement's state dict is the block's)."""
        parts = [getattr(module, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
        return (all(_linear(part) for part in parts) and _without_dropout(parts[2]) and parts[2].bias is None
                and type(getattr(module, "act_fn", None)).__name__ in ("SiLU", "SiLUActivation")
                and set(dict(module.named_children())) == {"gate_proj", "up_proj", "down_proj", "act_fn"}
                and not any(True for _ in module.act_fn.parameters())
                and not any(True for _ in module.named_parameters(recurse=False))
                and not any(True for _ in module.named_buffers(recurse=False)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        down = self.down_proj
        if adapted(down):
            return _SiluMulDownLoRA.apply(self.gate_proj(x), self.up_proj(x), down.weight, down.lora_A[ADAPTER].weight,
                                          down.lora_B[ADAPTER].weight, down.scaling[ADAPTER])
        return _SiluMulDown.apply(self.gate_proj(x), self.up_proj(x), down.weight)


def install_gated_mlp(model: torch.nn.Module) -> int:
    """Put a :class:`GatedMLP` in place of each decoder MLP of ``model``; returns how many (0 when the model type
    is not known to use exactly this block; a module that differs from it stays)."""
    config = model.config
    if getattr(config, "model_type", None) not in GATED_MLP_MODELS or getattr(config, "hidden_act", None) != "silu":
        return 0
    found = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if GatedMLP.fits(child)]
    for parent, name, child in found:
        setattr(parent, name, GatedMLP.from_module(child))
    return len(found)
