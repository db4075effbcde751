"""Advantage estimators: token-level rewards (+ values / baselines) -> advantages and returns.

Every estimator has the same call, ``fn(AdvantageInput) -> AdvantageOutput``, so the trainer never
branches on a name. Formulas and sources: ALGORITHMS.md; each function's docstring repeats its own.
Estimators carry three attributes the config validation and trainer read instead of names:
``min_group_size`` (responses per prompt they need), ``needs_values`` (a critic) and
``needs_baseline`` (greedy-response scores).

Where rlplat departs from the papers / peers:

* A group of one sample uses mean 0 and std 1 (grpo family, rloo, opo, gpg, reinforce_pp_baseline): its
  advantage is its own score. rloo has no leave-one-out baseline there, so it uses the same rule.
* Groups whose scores are all equal get an advantage of *exactly* 0 (the float mean of equal numbers
  can differ from them by an ulp, which a 1e-6 std epsilon would blow up to ~1e-11 noise).
* reinforce_pp / remax returns restart after the end of each response (G_t = m_t (r_t + γ G_{t+1})),
  and gae skips masked positions: "next" is the next *valid* token, as verl does for multi-turn masks.
* Estimators without a critic return ``returns = advantages``, as verl and TRL do.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rlplat.algorithms.masked import group_stats, masked_whiten, sequence_scores
from rlplat.registry import Registry

SCALES = ("group", "batch", "none")


@dataclass(frozen=True)
class AdvantageOptions:
    gamma: float = 1.0  # discount (gae, reinforce_pp, remax)
    lam: float = 1.0  # GAE lambda
    epsilon: float = 1e-6  # std epsilon of grpo-style normalisation
    scale: str = "group"  # grpo std scaling: "group" | "batch" | "none"
    norm_by_std: bool = True  # grpo_passk: divide by (std + epsilon)
    gpg_f_norm: float = 1.0  # gpg F_norm


@dataclass
class AdvantageInput:
    token_level_rewards: torch.Tensor  # [batch, response_len]
    response_mask: torch.Tensor  # [batch, response_len], bool or 0/1
    group_ids: torch.Tensor | None = None  # [batch] int: equal for the responses to one prompt
    values: torch.Tensor | None = None  # [batch, response_len] critic values (gae)
    baseline_scores: torch.Tensor | None = None  # [batch] score of the greedy response (remax)
    options: AdvantageOptions = field(default_factory=AdvantageOptions)


@dataclass
class AdvantageOutput:
    advantages: torch.Tensor  # [batch, response_len], 0 on masked tokens
    returns: torch.Tensor  # [batch, response_len]
    zero_variance: torch.Tensor | None = None  # [batch] bool: group of >= 2 with identical scores


Estimator = Callable[[AdvantageInput], AdvantageOutput]
ADVANTAGE_ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")


def get_advantage_estimator(name: str) -> Estimator:
    return ADVANTAGE_ESTIMATORS.get(name)


def compute_advantages(name: str, inp: AdvantageInput) -> AdvantageOutput:
    return get_advantage_estimator(name)(inp)


def estimator(name: str, min_group_size: int = 1, needs_values: bool = False, needs_baseline: bool = False):
    """Register an estimator under ``name`` with what it requires of the batch."""

    def decorator(fn: Estimator) -> Estimator:
        fn.min_group_size, fn.needs_values, fn.needs_baseline = min_group_size, needs_values, needs_baseline
        return ADVANTAGE_ESTIMATORS.register(name)(fn)

    return decorator


# ---------------------------------------------------------------------------- input checks and helpers
def _mask(inp: AdvantageInput) -> torch.Tensor:
    rewards, mask = inp.token_level_rewards, inp.response_mask
    if rewards.dim() != 2 or mask.shape != rewards.shape:
        raise ValueError(
            f"token_level_rewards and response_mask must both be [batch, response_len]; got "
            f"{tuple(rewards.shape)} and {tuple(mask.shape)}"
        )
    return mask.to(rewards.dtype)


def _require(inp: AdvantageInput, name: str, field_name: str, shape: str) -> torch.Tensor:
    value = getattr(inp, field_name)
    if value is None:
        raise ValueError(f"advantage estimator {name!r} needs AdvantageInput.{field_name} {shape}")
    batch = inp.token_level_rewards.shape[0]
    if value.shape[0] != batch:
        raise ValueError(f"AdvantageInput.{field_name} has {value.shape[0]} rows, expected {batch}")
    return value


def _broadcast(per_sequence: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return per_sequence.unsqueeze(-1) * mask


def _outcome(advantage: torch.Tensor, mask: torch.Tensor, zero_variance: torch.Tensor | None) -> AdvantageOutput:
    adv = _broadcast(advantage, mask)
    return AdvantageOutput(advantages=adv, returns=adv, zero_variance=zero_variance)


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = m_t (r_t + γ G_{t+1}), ``[batch, response_len]``; restarts after each response's end."""
    rewards = rewards * mask
    if gamma == 1.0:  # a reverse cumulative sum, with the reset applied where the mask is 0
        if bool((mask[:, 1:] <= mask[:, :-1]).all()):  # contiguous masks: no reset inside a response
            return rewards.flip(-1).cumsum(-1).flip(-1) * mask
    rewards_t, mask_t = rewards.T.contiguous(), mask.T.contiguous()  # time-major: contiguous rows
    returns_t = torch.zeros_like(rewards_t)
    running = torch.zeros_like(rewards_t[0])
    for t in reversed(range(rewards_t.shape[0])):
        running = (rewards_t[t] + gamma * running) * mask_t[t]
        returns_t[t] = running
    returns = returns_t.T
    return returns


# ---------------------------------------------------------------------------- grpo family
def _group_normalised(inp: AdvantageInput, name: str, scale: str) -> AdvantageOutput:
    """(s − mean_g) / (std + ε) with std over the group, the batch, or none (the grpo core)."""
    if scale not in SCALES:
        raise ValueError(f"AdvantageOptions.scale={scale!r} is not one of {SCALES}")
    mask = _mask(inp)
    scores = sequence_scores(inp.token_level_rewards, mask)
    groups = group_stats(scores, _require(inp, name, "group_ids", "[batch]"))
    single = groups.size == 1
    centred = scores - torch.where(single, torch.zeros_like(groups.mean), groups.mean)
    if scale == "group":
        std = torch.where(single, torch.ones_like(groups.std), groups.std)
        centred = centred / (std + inp.options.epsilon)
    elif scale == "batch":
        centred = centred / (scores.std() + inp.options.epsilon) if len(scores) > 1 else centred
    zero_variance = groups.all_equal & ~single
    return _outcome(torch.where(zero_variance, torch.zeros_like(centred), centred), mask, zero_variance)


@estimator("grpo", min_group_size=2)
def grpo(inp: AdvantageInput) -> AdvantageOutput:
    """GRPO (DeepSeekMath 2402.03300, Sec. 4.1.2): A_i = (s_i − mean_g s) / (std_g s + ε), broadcast.

    ``options.scale``: std over the group (default), over the batch, or none (TRL ``scale_rewards``).
    """
    return _group_normalised(inp, "grpo", inp.options.scale)


@estimator("dr_grpo", min_group_size=2)
def dr_grpo(inp: AdvantageInput) -> AdvantageOutput:
    """Dr. GRPO (2503.20783, Sec. 3.1): A_i = s_i − mean_g s — grpo without the std division."""
    return _group_normalised(inp, "dr_grpo", "none")


@estimator("dapo", min_group_size=2)
def dapo(inp: AdvantageInput) -> AdvantageOutput:
    """DAPO (2503.14476): grpo's advantage; ``zero_variance`` marks the groups dynamic sampling drops."""
    return _group_normalised(inp, "dapo", inp.options.scale)


@estimator("rloo", min_group_size=2)
def rloo(inp: AdvantageInput) -> AdvantageOutput:
    """RLOO (2402.14740, eq. 2): A_i = s_i − mean_{j≠i} s_j = G/(G−1) (s_i − mean_g s)."""
    mask = _mask(inp)
    scores = sequence_scores(inp.token_level_rewards, mask)
    groups = group_stats(scores, _require(inp, "rloo", "group_ids", "[batch]"))
    single = groups.size == 1
    factor = groups.size / (groups.size - 1).clamp(min=1)
    adv = torch.where(single, scores, factor * (scores - groups.mean))
    zero_variance = groups.all_equal & ~single
    return _outcome(torch.where(zero_variance, torch.zeros_like(adv), adv), mask, zero_variance)


@estimator("opo", min_group_size=2)
def opo(inp: AdvantageInput) -> AdvantageOutput:
    """OPO (2505.23585): A_i = s_i − b, b = Σ_j |o_j| s_j / Σ_j |o_j| (length-weighted group mean)."""
    mask = _mask(inp)
    scores = sequence_scores(inp.token_level_rewards, mask)
    lengths = mask.sum(-1)
    groups = group_stats(scores, _require(inp, "opo", "group_ids", "[batch]"))
    zeros = scores.new_zeros(int(groups.index.max()) + 1)
    weighted = zeros.index_add(0, groups.index, lengths * scores)[groups.index]
    total = zeros.index_add(0, groups.index, lengths)[groups.index]
    baseline = torch.where((groups.size > 1) & (total > 0), weighted / total.clamp(min=1), torch.zeros_like(scores))
    zero_variance = groups.all_equal & (groups.size > 1)
    adv = torch.where(zero_variance, torch.zeros_like(scores), scores - baseline)
    return _outcome(adv, mask, zero_variance)


@estimator("gpg", min_group_size=2)
def gpg(inp: AdvantageInput) -> AdvantageOutput:
    """GPG (2504.02546, eq. 9, as verl implements it): A_i = α (s_i − mean_g s) / F_norm,
    α = batch size / number of samples with a non-zero score (at least 1)."""
    mask = _mask(inp)
    scores = sequence_scores(inp.token_level_rewards, mask)
    groups = group_stats(scores, _require(inp, "gpg", "group_ids", "[batch]"))
    alpha = len(scores) / max(int((scores != 0).sum()), 1)
    mean = torch.where(groups.size > 1, groups.mean, torch.zeros_like(groups.mean))
    zero_variance = groups.all_equal & (groups.size > 1)
    adv = torch.where(zero_variance, torch.zeros_like(scores), alpha * (scores - mean) / inp.options.gpg_f_norm)
    return _outcome(adv, mask, zero_variance)


@estimator("grpo_passk", min_group_size=2)
def grpo_passk(inp: AdvantageInput) -> AdvantageOutput:
    """Pass@k training (2503.19595): only each group's best response (first on ties) gets
    s_max − s_second (÷ (std_g + ε) with ``norm_by_std``); the others get 0."""
    mask = _mask(inp)
    scores = sequence_scores(inp.token_level_rewards, mask)
    groups = group_stats(scores, _require(inp, "grpo_passk", "group_ids", "[batch]"))
    if bool((groups.size < 2).any()):
        raise ValueError("grpo_passk needs at least 2 responses per prompt (rollout.n >= 2)")
    num_groups = int(groups.index.max()) + 1
    position = torch.arange(len(scores))
    best_score = scores.new_zeros(num_groups).scatter_reduce(0, groups.index, scores, "amax", include_self=False)
    at_max = scores == best_score[groups.index]
    first = position.new_zeros(num_groups).scatter_reduce(
        0, groups.index, torch.where(at_max, position, len(scores)), "amin", include_self=False
    )
    is_best = position == first[groups.index]
    others = torch.where(is_best, torch.full_like(scores, -torch.inf), scores)
    second = scores.new_zeros(num_groups).scatter_reduce(0, groups.index, others, "amax", include_self=False)
    gain = best_score[groups.index] - second[groups.index]
    if inp.options.norm_by_std:
        gain = gain / (groups.std + inp.options.epsilon)
    return _outcome(torch.where(is_best, gain, torch.zeros_like(gain)), mask, groups.all_equal)


# ---------------------------------------------------------------------------- token-level returns
@estimator("reinforce_pp")
def reinforce_pp(inp: AdvantageInput) -> AdvantageOutput:
    """REINFORCE++ (2501.03262, Sec. 3): G_t = Σ_{k≥t} γ^{k−t} r_k, advantages = whiten(G) over the batch."""
    mask = _mask(inp)
    returns = discounted_returns(inp.token_level_rewards, mask, inp.options.gamma)
    return AdvantageOutput(advantages=masked_whiten(returns, mask), returns=returns)


@estimator("reinforce_pp_baseline", min_group_size=2)
def reinforce_pp_baseline(inp: AdvantageInput) -> AdvantageOutput:
    """REINFORCE++ with a group baseline (2501.03262): (s_i − mean_g s) over tokens, then whiten."""
    mask = _mask(inp)
    scores = sequence_scores(inp.token_level_rewards, mask)
    groups = group_stats(scores, _require(inp, "reinforce_pp_baseline", "group_ids", "[batch]"))
    centred = scores - torch.where(groups.size > 1, groups.mean, torch.zeros_like(groups.mean))
    adv = masked_whiten(_broadcast(centred, mask), mask)
    return AdvantageOutput(advantages=adv, returns=adv, zero_variance=groups.all_equal & (groups.size > 1))


@estimator("remax", needs_baseline=True)
def remax(inp: AdvantageInput) -> AdvantageOutput:
    """ReMax (2310.10505, Alg. 1): A_{i,t} = G_t − b_i, b_i = score of the greedy response to the prompt."""
    mask = _mask(inp)
    baseline = _require(inp, "remax", "baseline_scores", "[batch]").to(mask.dtype)
    returns = discounted_returns(inp.token_level_rewards, mask, inp.options.gamma)
    return AdvantageOutput(advantages=(returns - baseline.unsqueeze(-1)) * mask, returns=returns)


@estimator("gae", needs_values=True)
def gae(inp: AdvantageInput) -> AdvantageOutput:
    """GAE (1506.02438, eq. 16): δ_t = r_t + γV_{t+1} − V_t, A_t = δ_t + γλA_{t+1} over valid tokens;
    returns = A + V; advantages = whiten(A). "Next" is the next valid token; after the last, V = A = 0."""
    mask = _mask(inp)
    values = _require(inp, "gae", "values", "[batch, response_len]").to(mask.dtype)
    gamma, lam = inp.options.gamma, inp.options.lam
    # Time-major copies: the reverse loop then reads contiguous rows instead of strided columns.
    rewards_t, values_t, mask_t = (inp.token_level_rewards * mask).T.contiguous(), values.T.contiguous(), mask.T.contiguous()
    advantages_t = torch.zeros_like(rewards_t)
    next_value = torch.zeros_like(rewards_t[0])
    next_adv = torch.zeros_like(rewards_t[0])
    for t in reversed(range(rewards_t.shape[0])):
        valid = mask_t[t] > 0
        adv_t = rewards_t[t] + gamma * next_value - values_t[t] + gamma * lam * next_adv
        advantages_t[t] = adv_t * mask_t[t]
        # invalid positions are skipped: they pass the next valid token's value and advantage through
        next_value = torch.where(valid, values_t[t], next_value)
        next_adv = torch.where(valid, adv_t, next_adv)
    advantages = advantages_t.T
    returns = (advantages + values) * mask
    return AdvantageOutput(advantages=masked_whiten(advantages, mask), returns=returns)
