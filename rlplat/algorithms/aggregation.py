"""Loss aggregation: a per-token loss ``[batch, response_len]`` -> the scalar that is back-propagated.

Every mode divides by a denominator that belongs to the **whole mini-batch** (all micro-batches, all
data-parallel ranks), passed in explicitly as :class:`LossDenominators`. Summing the gradients of the
micro-batch losses therefore gives exactly the gradient of the full mini-batch loss, whatever the split.
This is where rlplat departs from verl, which normalises ``token-mean`` per micro-batch so that gradient
accumulation changes the objective (verl issue #5625).

Data parallelism: the property above is about *summed* gradients. FSDP/DDP *average* gradients over the
``dp`` ranks, so a trainer using them multiplies each rank's loss by ``dp`` (or reduces with a sum).

Modes (docs/algorithms.md, "Loss aggregation"; m is the response mask, N the mini-batch's sequences
with at least one valid token):

=========================  =====================================================================
``token-mean``             Σ_{i,t} L·m / (valid tokens of the mini-batch)
``token-sum``              Σ_{i,t} L·m (no normaliser)
``seq-mean-token-sum``     Σ_i Σ_t L·m / N
``seq-mean-token-mean``    Σ_i (Σ_t L·m / Σ_t m) / N
``seq-mean-token-sum-norm``Σ_{i,t} L·m / (N·C), C = ``loss_scale_factor`` or the response length
                           (Dr. GRPO 2503.20783, Sec. 3.1: 1/G over the responses, a constant C
                           instead of |o_i|)
=========================  =====================================================================
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlplat.registry import Registry


@dataclass(frozen=True)
class LossDenominators:
    """Global counts of the mini-batch the loss belongs to (summed over micro-batches and ranks)."""

    num_tokens: float  # valid response tokens
    num_seqs: float  # sequences with at least one valid token

    @classmethod
    def from_mask(cls, response_mask: torch.Tensor) -> LossDenominators:
        """Counts of one ``[batch, response_len]`` mask. Sum these over micro-batches (and all-reduce
        over ranks) to build the mini-batch's denominators."""
        mask = response_mask.bool()
        return cls(num_tokens=float(mask.sum()), num_seqs=float(mask.any(-1).sum()))

    def __add__(self, other: LossDenominators) -> LossDenominators:
        return LossDenominators(self.num_tokens + other.num_tokens, self.num_seqs + other.num_seqs)


AggregationFn = Callable[[torch.Tensor, torch.Tensor, LossDenominators, float | None], torch.Tensor]
AGGREGATION_MODES: Registry[AggregationFn] = Registry("loss aggregation mode")


def get_aggregation(name: str) -> AggregationFn:
    return AGGREGATION_MODES.get(name)


def aggregate_loss(
    loss: torch.Tensor,
    response_mask: torch.Tensor,
    mode: str,
    denominators: LossDenominators | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Reduce ``loss`` ``[batch, response_len]`` to a scalar with the named mode.

    ``denominators`` default to this tensor's own counts, which is right only when it *is* the whole
    mini-batch; micro-batched callers must pass the mini-batch's.
    """
    if loss.shape != response_mask.shape:
        raise ValueError(
            f"loss {tuple(loss.shape)} and response_mask {tuple(response_mask.shape)} must match"
        )
    if denominators is None:
        denominators = LossDenominators.from_mask(response_mask)
    return get_aggregation(mode)(loss, response_mask, denominators, loss_scale_factor)


def _safe(denominator: float) -> float:
    # An all-masked mini-batch has no valid token: its loss is 0 (not NaN) and so is its gradient.
    return max(float(denominator), 1.0)


@AGGREGATION_MODES.register("token-mean")
def token_mean(loss, mask, denominators: LossDenominators, loss_scale_factor=None):
    """Σ_{i,t} L·m / (global valid-token count). DAPO (2503.14476) token-level loss."""
    return (loss * mask.to(loss.dtype)).sum() / _safe(denominators.num_tokens)


@AGGREGATION_MODES.register("token-sum")
def token_sum(loss, mask, denominators: LossDenominators, loss_scale_factor=None):
    """Σ_{i,t} L·m: the plain sum over valid tokens, so the loss grows with the mini-batch (verl's
    ``token-sum``). Micro-batch invariant without any denominator."""
    return (loss * mask.to(loss.dtype)).sum()


@AGGREGATION_MODES.register("seq-mean-token-sum")
def seq_mean_token_sum(loss, mask, denominators: LossDenominators, loss_scale_factor=None):
    """Σ_i Σ_t L·m / (global count of sequences with a valid token)."""
    return (loss * mask.to(loss.dtype)).sum() / _safe(denominators.num_seqs)


@AGGREGATION_MODES.register("seq-mean-token-mean")
def seq_mean_token_mean(loss, mask, denominators: LossDenominators, loss_scale_factor=None):
    """Σ_i (Σ_t L·m / Σ_t m) / N: GRPO's original 1/G Σ 1/|o_i| Σ_t (2402.03300, eq. 3).

    A sequence is never split across micro-batches, so its own token count is local; only N is global.
    """
    mask = mask.to(loss.dtype)
    per_seq = (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    return per_seq.sum() / _safe(denominators.num_seqs)


@AGGREGATION_MODES.register("seq-mean-token-sum-norm")
def seq_mean_token_sum_norm(loss, mask, denominators: LossDenominators, loss_scale_factor=None):
    """Σ_{i,t} L·m / (N·C), Dr. GRPO (2503.20783, Sec. 3.1, the "Dr. GRPO" objective): the mean over
    the mini-batch's N sequences (the paper's 1/G) of each sequence's token *sum* divided by a constant
    C (``loss_scale_factor``, or the padded response length) instead of its own length |o_i|.

    N is the global sequence count of ``denominators`` (as for ``seq-mean-token-sum``), so the mode is
    micro-batch invariant. The default C is the padded response length of ``loss``; micro-batches must
    then share it, so the trainer always passes the configured maximum response length explicitly.
    """
    scale = float(loss_scale_factor) if loss_scale_factor is not None else float(mask.shape[-1])
    if scale <= 0:
        raise ValueError(f"loss_scale_factor must be > 0, got {loss_scale_factor}")
    return (loss * mask.to(loss.dtype)).sum() / (_safe(denominators.num_seqs) * scale)
