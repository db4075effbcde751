"""Log-probs, entropy and Σπ² from vocabulary-parallel logits: each tensor-parallel rank holds the logits of
a slice of the vocabulary, and three all-reduces per position (the max, the normaliser, the picked logit)
replace gathering them."""

from __future__ import annotations

import torch
import torch.distributed as dist

from rlplat.engines.base import ForwardOutput


def mask_vocab_padding(logits: torch.Tensor, tp_rank: int, vocab_size: int) -> torch.Tensor:
    """The rows Megatron added to make the vocabulary divisible by tp get no probability (this rank's slice
    of the logits ``[..., V / tp]``)."""
    start = tp_rank * logits.shape[-1]
    real = max(0, min(logits.shape[-1], vocab_size - start))
    if real == logits.shape[-1]:
        return logits
    pad = torch.full_like(logits[..., real:], -1e9)
    return torch.cat([logits[..., :real], pad], dim=-1)


def _tp_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over the tensor-parallel group; the gradient passes through unchanged (the loss is the same on
    every tensor-parallel rank)."""
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    return reduce_from_tensor_model_parallel_region(tensor)


def vocab_parallel_outputs(logits: torch.Tensor, targets: torch.Tensor, vocab_start: int, need_entropy: bool,
                           need_sum_pi_squared: bool) -> ForwardOutput:
    """Log-prob of ``targets`` ``[B, R]`` (and entropy, Σπ²) from this rank's vocabulary slice of the
    logits ``[B, R, V / tp]``, which start at id ``vocab_start``."""
    from megatron.core import parallel_state

    peak = logits.detach().amax(-1, keepdim=True)
    dist.all_reduce(peak, op=dist.ReduceOp.MAX, group=parallel_state.get_tensor_model_parallel_group())
    shifted = logits - peak
    log_norm = _tp_sum(shifted.exp().sum(-1, keepdim=True)).log()
    local = targets - vocab_start
    inside = (local >= 0) & (local < logits.shape[-1])
    picked = shifted.gather(-1, local.clamp(0, logits.shape[-1] - 1).unsqueeze(-1)).squeeze(-1) * inside
    out = ForwardOutput(log_probs=_tp_sum(picked) - log_norm.squeeze(-1))
    if need_entropy or need_sum_pi_squared:
        log_p = shifted - log_norm
        p = log_p.exp()
        out.entropy = -_tp_sum((p * log_p).sum(-1)) if need_entropy else None
        out.sum_pi_squared = _tp_sum(p.square().sum(-1)) if need_sum_pi_squared else None
    return out
