"""Optimal token baselines: a per-position, variance-weighted group baseline (docs/algorithms.md).

For a prompt's group of responses, the baseline at token position t is the average of the responses'
returns-to-go G_t weighted by how much gradient variance each response has accumulated up to t:

    w_t = 1 − 2 π_t + Σ_v π(v)²          (‖∇log π(a_t)‖² of a softmax policy, up to the logit features)
    W_t = Σ_{j ≤ t} w_j m_j               (cumulative "path variance" of the response)
    B_t = Σ_i G_{i,t} W_{i,t} m_{i,t} / (Σ_i W_{i,t} m_{i,t} + ε),   A_{i,t} = (G_{i,t} − B_t) m_{i,t}

with π_t = exp(old_log_probs) the sampling policy's probability of the sampled token and Σπ² its
squared-probability mass at that position (``sum_pi_squared``). G is the undiscounted reward-to-go.
This is the minimum-variance baseline of "On the optimal baseline for policy gradient in LLM RL"
as verl implements it (``optimal_token_baseline``); ``tir_optimal_token_baseline`` is verl's variant
for tool-integrated (multi-turn) masks: positions count *valid* tokens only (masked observation tokens
are squeezed out before the baseline is taken and the result is put back in place).

With an off-policy correction on (``algorithm.off_policy``, e.g. ``tis``), each w_t is scaled by the square
of its importance weight ρ̄_t (for ``tis``, min(π_old / π_rollout, cap)), the baseline that minimises the variance of the
importance-weighted gradient (verl's ``rollout_is_weights``): B_t = Σ_i G_{i,t} W̃_{i,t} / Σ_i W̃_{i,t} with
W̃_t = Σ_{j ≤ t} ρ̄_j² w_j m_j.

"Zero tail" (``algorithm.otb_zero_tail``, on by default in both variants, as verl's ``handle_zero_tail``):
when one response of a group is strictly the longest, its positions beyond the second-longest response
have no other response to compare with; there the weighted baseline would equal its own return
(advantage 0), so the baseline is set to 0. Off, those positions keep the weighted baseline.

Where rlplat departs from verl: returns are 0 on masked tokens; a group of one response has baseline 0 in
both variants (its advantage is its return).
"""

from __future__ import annotations

import torch

from rlplat.algorithms.advantages import (
    AdvantageInput,
    AdvantageOutput,
    _per_group,
    _require,
    _token_mask,
    estimator,
)
from rlplat.algorithms.masked import group_stats

OTB_EPS = 1e-8  # keeps B_t finite where no response of the group has accumulated variance


def _inputs(inp: AdvantageInput, name: str):
    mask = _token_mask(inp)
    group_ids = _require(inp, name, "group_ids")
    old = _require(inp, name, "old_log_probs").to(mask.dtype)
    sum_pi_sq = _require(inp, name, "sum_pi_squared").to(mask.dtype)
    rewards = inp.token_level_rewards * mask
    per_token = (1 - 2 * old.exp() + sum_pi_sq) * mask  # w_t, [batch, response_len]
    if inp.importance_weights is not None:  # ρ̄_t² w_t under the rollout correction
        per_token = per_token * inp.importance_weights.to(mask.dtype).square()
    return mask, group_ids, rewards, per_token


def _baseline(returns, cum_var, mask, group_ids, zero_tail: bool) -> torch.Tensor:
    """B ``[batch, T]`` from returns G, cumulative variance W and mask, all ``[batch, T]``."""
    groups = group_stats(mask.new_zeros(mask.shape[0]), group_ids)  # only index and size are used
    num_groups = int(groups.index.max()) + 1 if len(groups.index) else 0
    weights = cum_var * mask
    width = mask.shape[1]
    # Sums over each group's rows, per position, as one 1-D index_add over flattened (group, position)
    # cells: the 2-D index_add along dim 0 is orders of magnitude slower on CPU.
    cell = (groups.index.unsqueeze(-1) * width + torch.arange(width, device=mask.device)).flatten()

    def group_sum(x: torch.Tensor) -> torch.Tensor:  # [batch, T] -> [num_groups, T]
        return x.new_zeros(num_groups * width).index_add_(0, cell, x.flatten()).view(num_groups, width)

    baseline = (group_sum(returns * weights) / (group_sum(weights) + OTB_EPS))[groups.index]
    baseline = baseline.masked_fill((groups.size == 1).unsqueeze(-1), 0.0)
    if zero_tail:
        lengths = mask.sum(-1)
        longest = _per_group(lengths, groups, "amax")
        is_longest = lengths == longest
        unique_longest = _per_group(is_longest.to(lengths.dtype), groups, "sum") == 1
        second = _per_group(lengths.masked_fill(is_longest, -1.0), groups, "amax")  # -1: group of one
        tail = is_longest & unique_longest & (groups.size > 1)
        positions = torch.arange(mask.shape[1], device=mask.device, dtype=lengths.dtype)
        baseline = baseline.masked_fill(tail.unsqueeze(-1) & (positions >= second.unsqueeze(-1)), 0.0)
    return baseline


def _reverse_cumsum(x: torch.Tensor) -> torch.Tensor:
    return x.flip(-1).cumsum(-1).flip(-1)


@estimator("optimal_token_baseline", min_group_size=2, needs_sum_pi_squared=True)
def optimal_token_baseline(inp: AdvantageInput) -> AdvantageOutput:
    """Optimal token baseline (module docstring; verl ``optimal_token_baseline``): A_{i,t} = G_{i,t} − B_t
    with the per-position, W-weighted group baseline B_t taken over raw positions t.
    Needs ``group_ids`` ``[batch]``, ``old_log_probs`` and ``sum_pi_squared`` ``[batch, response_len]``;
    returns = G."""
    mask, group_ids, rewards, per_token = _inputs(inp, "optimal_token_baseline")
    returns = _reverse_cumsum(rewards) * mask
    baseline = _baseline(returns, per_token.cumsum(-1), mask, group_ids, inp.options.otb_zero_tail)
    return AdvantageOutput(advantages=(returns - baseline) * mask, returns=returns)


@estimator("tir_optimal_token_baseline", min_group_size=2, needs_sum_pi_squared=True)
def tir_optimal_token_baseline(inp: AdvantageInput) -> AdvantageOutput:
    """Optimal token baseline for multi-turn masks (verl ``tir_optimal_token_baseline``): the same B, but
    position k is a response's k-th *valid* token (masked observation tokens are squeezed out first).
    Inputs and outputs as :func:`optimal_token_baseline`."""
    mask, group_ids, rewards, per_token = _inputs(inp, "tir_optimal_token_baseline")
    valid = mask > 0
    rank = (valid.long().cumsum(-1) - 1).clamp(min=0)  # [batch, T]: index of each valid token in its row
    width = int(valid.sum(-1).max()) if valid.numel() else 0
    compact_mask = (torch.arange(width, device=mask.device) < valid.sum(-1, keepdim=True)).to(mask.dtype)

    def squeeze(x: torch.Tensor) -> torch.Tensor:  # [batch, T] -> [batch, width], valid tokens first
        return x.new_zeros(x.shape[0], width).scatter_add_(1, rank, x * mask)

    returns_c = _reverse_cumsum(squeeze(rewards))
    baseline = _baseline(returns_c, squeeze(per_token).cumsum(-1), compact_mask, group_ids, inp.options.otb_zero_tail)
    advantages_c = (returns_c - baseline) * compact_mask
    advantages = advantages_c.gather(1, rank) * mask if width else torch.zeros_like(mask)
    returns = returns_c.gather(1, rank) * mask if width else torch.zeros_like(mask)
    return AdvantageOutput(advantages=advantages, returns=returns)
