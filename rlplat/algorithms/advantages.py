"""Advantage estimators: token-level rewards (+ critic values or a greedy baseline) -> advantages, returns.

Every estimator has one call, ``fn(AdvantageInput) -> AdvantageOutput``, and is registered in
``ADVANTAGE_ESTIMATORS`` with an :class:`EstimatorSpec` that says what it needs of the run (a critic,
greedy-response scores, Σπ², groups of a minimum size). The run plan copies the spec once
(:func:`estimator_spec`), and everything else reads the plan instead of branching on names.
Formulas: ``docs/algorithms.md``; each docstring repeats its own.

Conventions. s_i = Σ_t r_{i,t} m_{i,t} is a response's score; per-response advantages are broadcast over
its valid tokens; advantages are 0 on masked tokens. Estimators without a critic return
``returns = advantages`` (the same tensor), as verl and TRL do.

Group of one: a prompt with a single response has mean 0 (baseline 0) and std 1, so its advantage is its
own score (grpo, dr_grpo, dapo, rloo, opo, gpg, reinforce_pp_baseline); grpo_passk refuses such groups.
Groups of >= 2 whose scores are all equal get an advantage of exactly 0 (the float mean of equal numbers
can miss them by an ulp, which a 1e-6 std epsilon would turn into ~1e-11 noise) and are flagged in
``zero_variance``.

Where each estimator departs from its paper:

* ``grpo``: outcome supervision only (the paper's process-supervision variant is not implemented); ε is
  added to the std as verl does; ``scale`` adds TRL's batch-std and no-std variants.
* ``dr_grpo``: none in the advantage; the paper's constant loss normaliser is an aggregation mode.
* ``dapo``: none in the advantage; dynamic sampling itself is the trainer's, this only flags the groups.
* ``rloo``: the leave-one-out baseline is undefined for a group of one; it uses baseline 0 there.
* ``reinforce_pp``: the paper's KL-in-reward is applied by the trainer before this runs; the discounted
  return carries across masked tokens inside a response (a multi-turn mask's observation tokens are not
  steps), where verl restarts it at every masked token and so gives earlier turns no credit.
* ``reinforce_pp_baseline``: follows verl: the group mean is subtracted from the score, then whitened.
* ``remax``: returns are discounted by ``gamma`` (the paper's γ = 1 is the default) and carry across
  masked tokens as in ``reinforce_pp``.
* ``opo``: none in the advantage; the paper's exact on-policy training is the trainer's concern.
* ``gpg``: α counts the samples with a non-zero score, as verl implements it.
* ``grpo_passk``: follows verl: only the best response gets s_max − s_second (optionally ÷ (std + ε)).
* ``gae``: masked tokens are not steps: "next" is the next valid token, and V = A = 0 after the last.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rlplat.algorithms.masked import GroupStats, group_stats, masked_whiten, sequence_scores
from rlplat.registry import Registry

SCALES = ("group", "batch", "none")  # grpo std scaling, TRL's ``scale_rewards`` values


@dataclass(frozen=True)
class AdvantageOptions:
    gamma: float = 1.0  # discount (gae, reinforce_pp, remax)
    lam: float = 1.0  # GAE lambda
    epsilon: float = 1e-6  # std epsilon of grpo-style normalisation
    scale: str = "group"  # grpo std: per group, over the whole batch, or none (mean is always per group)
    gpg_f_norm: float = 1.0  # gpg F_norm
    otb_zero_tail: bool = True  # optimal token baselines: the "zero tail" (token_baselines.py)

    def __post_init__(self):
        if self.scale not in SCALES:
            raise ValueError(f"AdvantageOptions.scale={self.scale!r} is not one of {SCALES}")
        if not self.gpg_f_norm > 0:
            raise ValueError(f"gpg_f_norm must be > 0, got {self.gpg_f_norm}")


@dataclass
class AdvantageInput:
    token_level_rewards: torch.Tensor  # [batch, response_len] float
    response_mask: torch.Tensor  # [batch, response_len] bool or 0/1
    group_ids: torch.Tensor | None = None  # [batch] int64, equal for the responses to one prompt
    values: torch.Tensor | None = None  # [batch, response_len] critic values (gae)
    baseline_scores: torch.Tensor | None = None  # [batch] score of the greedy response (remax)
    reward_components: torch.Tensor | None = None  # [batch, num_rewards] unweighted reward terms (gdpo)
    reward_weights: torch.Tensor | None = None  # [num_rewards] their weights (gdpo; default all 1)
    old_log_probs: torch.Tensor | None = None  # [batch, response_len] sampling policy (optimal baselines)
    sum_pi_squared: torch.Tensor | None = None  # [batch, response_len] Σ_v π(v)² (optimal baselines)
    # [batch, response_len] importance weights of the off-policy correction (algorithm.off_policy), when one
    # is on (optimal baselines scale their variance term by their square)
    importance_weights: torch.Tensor | None = None
    options: AdvantageOptions = field(default_factory=AdvantageOptions)


@dataclass
class AdvantageOutput:
    advantages: torch.Tensor  # [batch, response_len], 0 on masked tokens
    returns: torch.Tensor  # [batch, response_len]
    zero_variance: torch.Tensor | None = None  # [batch] bool: group of >= 2 with identical scores


Estimator = Callable[[AdvantageInput], AdvantageOutput]
ADVANTAGE_ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")


def get_advantage_estimator(name: str) -> Estimator:
    """The estimator registered under ``name``; a miss raises ``UnknownNameError`` (known names listed)."""
    return ADVANTAGE_ESTIMATORS.get(name)


def compute_advantages(name: str, inp: AdvantageInput) -> AdvantageOutput:
    return get_advantage_estimator(name)(inp)


@dataclass(frozen=True)
class EstimatorSpec:
    """What an advantage estimator needs of the run, declared where it is registered."""

    min_group_size: int = 1  # responses per prompt it compares (rollout.n must be at least this)
    needs_values: bool = False  # a critic's values (the run gets a critic)
    needs_baseline: bool = False  # the score of a greedy response to each prompt (remax)
    needs_sum_pi_squared: bool = False  # the policy's Σ_v π(v)² per token, from the actor's log-prob pass
    uses_reward_terms: bool = False  # reads each reward function's term, not the (KL-shaped) token rewards
    # its advantage is on-policy distillation's term alone (algorithm.distill), none from the task reward
    distills: bool = False


def estimator(name: str, **spec):
    """Register an estimator under ``name`` with its :class:`EstimatorSpec` (keyword arguments)."""

    def decorator(fn: Estimator) -> Estimator:
        fn.spec = EstimatorSpec(**spec)
        return ADVANTAGE_ESTIMATORS.register(name)(fn)

    return decorator


def estimator_spec(name: str) -> EstimatorSpec:
    """The spec of the estimator registered under ``name``; one registered without :func:`estimator`
    (plain ``ADVANTAGE_ESTIMATORS.register``) needs nothing beyond the rewards."""
    return getattr(get_advantage_estimator(name), "spec", EstimatorSpec())


# ---------------------------------------------------------------------------- inputs and shared pieces
_SHAPES = {"group_ids": "[batch]", "baseline_scores": "[batch]", "values": "[batch, response_len]",
           "old_log_probs": "[batch, response_len]", "sum_pi_squared": "[batch, response_len]"}


def _token_mask(inp: AdvantageInput) -> torch.Tensor:
    """The mask as a 0/1 tensor of the rewards' dtype, converted once and reused by every step."""
    rewards, mask = inp.token_level_rewards, inp.response_mask
    if rewards.dim() != 2 or mask.shape != rewards.shape:
        raise ValueError(
            f"token_level_rewards and response_mask must both be [batch, response_len]; got "
            f"{tuple(rewards.shape)} and {tuple(mask.shape)}"
        )
    return mask.to(rewards.dtype)


def _require(inp: AdvantageInput, name: str, field_name: str) -> torch.Tensor:
    value, shape = getattr(inp, field_name), _SHAPES[field_name]
    if value is None:
        raise ValueError(f"advantage estimator {name!r} needs AdvantageInput.{field_name}, a {shape} tensor")
    rewards = inp.token_level_rewards
    expected = tuple(rewards.shape) if "response_len" in shape else tuple(rewards.shape[:1])
    if tuple(value.shape) != expected:
        raise ValueError(
            f"AdvantageInput.{field_name} has shape {tuple(value.shape)}; expected {shape} = {expected}"
        )
    return value


def _scored_groups(inp: AdvantageInput, name: str) -> tuple[torch.Tensor, torch.Tensor, GroupStats]:
    """(mask [batch, response_len], scores [batch], their group statistics)."""
    mask = _token_mask(inp)
    group_ids = _require(inp, name, "group_ids")
    scores = sequence_scores(inp.token_level_rewards, mask)
    return mask, scores, group_stats(scores, group_ids)


def _zero_variance(groups: GroupStats) -> torch.Tensor:
    return groups.all_equal & (groups.size > 1)


def _centred(scores: torch.Tensor, groups: GroupStats) -> torch.Tensor:
    """s_i − mean_g s, ``[batch]``: mean 0 for a group of one, exactly 0 in a zero-variance group."""
    centred = scores - groups.mean.masked_fill(groups.size == 1, 0.0)
    return centred.masked_fill(_zero_variance(groups), 0.0)


def _per_group(values: torch.Tensor, groups: GroupStats, reduce: str) -> torch.Tensor:
    """Reduce ``[batch]`` values within each group ("sum", "amax", "amin"), then read back per sample."""
    num_groups = int(groups.index.max()) + 1 if len(values) else 0
    out = values.new_zeros(num_groups).scatter_reduce(0, groups.index, values, reduce, include_self=False)
    return out[groups.index]


def _broadcast(advantage: torch.Tensor, mask: torch.Tensor, groups: GroupStats | None) -> AdvantageOutput:
    """Per-response ``[batch]`` advantages onto valid tokens; returns = advantages (no critic)."""
    tokens = advantage.unsqueeze(-1) * mask
    zero_variance = None if groups is None else _zero_variance(groups)
    return AdvantageOutput(advantages=tokens, returns=tokens, zero_variance=zero_variance)


# ---------------------------------------------------------------------------- grpo family
def _grpo_core(inp: AdvantageInput, name: str, scale: str) -> AdvantageOutput:
    """(s − mean_g) / (std + ε), the std taken over the group, over the batch, or not at all."""
    mask, scores, groups = _scored_groups(inp, name)
    advantage = _centred(scores, groups)
    if scale == "group":
        advantage = advantage / (groups.std.masked_fill(groups.size == 1, 1.0) + inp.options.epsilon)
    elif scale == "batch":  # a batch of one sample is a group of one: std 1
        batch_std = scores.std() if len(scores) > 1 else scores.new_ones(())
        advantage = advantage / (batch_std + inp.options.epsilon)
    return _broadcast(advantage, mask, groups)


@estimator("grpo", min_group_size=2)
def grpo(inp: AdvantageInput) -> AdvantageOutput:
    """GRPO outcome advantage (DeepSeekMath 2402.03300, Sec. 4.1.2; as verl implements it):
    A_i = (s_i − mean_g s) / (std_g s + ε), unbiased std, broadcast over ``[batch, response_len]``.

    ``options.scale`` = "batch" divides by the std of all ``[batch]`` scores, "none" by nothing (TRL
    ``scale_rewards``); the mean stays per group. Needs ``group_ids`` ``[batch]``.
    """
    return _grpo_core(inp, "grpo", inp.options.scale)


@estimator("dr_grpo", min_group_size=2)
def dr_grpo(inp: AdvantageInput) -> AdvantageOutput:
    """Dr. GRPO (2503.20783, Sec. 3.1): A_i = s_i − mean_g s, i.e. grpo with scale "none"
    (``options.scale`` is ignored). Needs ``group_ids`` ``[batch]``; advantages ``[batch, response_len]``."""
    return _grpo_core(inp, "dr_grpo", "none")


@estimator("dapo", min_group_size=2)
def dapo(inp: AdvantageInput) -> AdvantageOutput:
    """DAPO (2503.14476, eq. 9 and Sec. 3.2): grpo's advantage; ``zero_variance`` ``[batch]`` marks the
    groups whose scores are all equal, which dynamic sampling drops. Needs ``group_ids`` ``[batch]``."""
    return _grpo_core(inp, "dapo", inp.options.scale)


@estimator("gdpo", min_group_size=2, uses_reward_terms=True)
def gdpo(inp: AdvantageInput) -> AdvantageOutput:
    """GDPO (2601.05242, Sec. 3; as verl implements it): each reward term k is group-normalised on its
    own, A_k = (c_k − mean_g c_k) / (std_g c_k + ε); then A = whiten(Σ_k w_k A_k) over the batch's valid
    tokens. ``reward_components`` ``[batch, num_rewards]`` (unweighted terms), ``reward_weights``
    ``[num_rewards]`` (default 1); without components the sequence score is the only term (GRPO followed
    by batch whitening). ``options.scale`` applies to each term as in grpo. Needs ``group_ids``."""
    mask = _token_mask(inp)
    group_ids = _require(inp, "gdpo", "group_ids")
    components = inp.reward_components
    if components is None:
        components = sequence_scores(inp.token_level_rewards, mask).unsqueeze(-1)
    if components.dim() != 2 or components.shape[0] != mask.shape[0]:
        raise ValueError(f"AdvantageInput.reward_components has shape {tuple(components.shape)}; expected "
                         f"[batch, num_rewards] with batch = {mask.shape[0]}")
    weights = inp.reward_weights if inp.reward_weights is not None else components.new_ones(components.shape[1])
    if tuple(weights.shape) != (components.shape[1],):
        raise ValueError(f"AdvantageInput.reward_weights has shape {tuple(weights.shape)}; expected "
                         f"[num_rewards] = ({components.shape[1]},)")
    total = mask.new_zeros(mask.shape[0])
    zero_variance = torch.ones(mask.shape[0], dtype=torch.bool, device=mask.device)
    for k in range(components.shape[1]):
        term = components[:, k].to(mask.dtype)
        one = AdvantageInput(term.unsqueeze(-1), torch.ones_like(term).unsqueeze(-1), group_ids,
                             options=inp.options)
        out = _grpo_core(one, "gdpo", inp.options.scale)
        total = total + float(weights[k]) * out.advantages[:, 0]
        zero_variance &= out.zero_variance
    advantages = masked_whiten(total.unsqueeze(-1) * mask, mask)
    return AdvantageOutput(advantages=advantages, returns=advantages, zero_variance=zero_variance)


@estimator("rloo", min_group_size=2)
def rloo(inp: AdvantageInput) -> AdvantageOutput:
    """RLOO (2402.14740, Sec. 3): A_i = s_i − mean_{j≠i} s_j = G/(G−1) · (s_i − mean_g s), as verl
    implements it. Needs ``group_ids`` ``[batch]``; advantages ``[batch, response_len]``."""
    mask, scores, groups = _scored_groups(inp, "rloo")
    leave_one_out = groups.size / (groups.size - 1).clamp(min=1)  # 1 for a group of one: A = s
    return _broadcast(leave_one_out * _centred(scores, groups), mask, groups)


@estimator("opo", min_group_size=2)
def opo(inp: AdvantageInput) -> AdvantageOutput:
    """OPO (2505.23585, eq. 5): A_i = s_i − b, b = Σ_j |o_j| s_j / Σ_j |o_j| over the group, |o_j| = valid
    tokens of response j (as verl implements it). Needs ``group_ids`` ``[batch]``."""
    mask, scores, groups = _scored_groups(inp, "opo")
    lengths = mask.sum(-1)
    weighted = _per_group(lengths * scores, groups, "sum")
    total = _per_group(lengths, groups, "sum")
    baseline = (weighted / total.clamp(min=1)).masked_fill(groups.size == 1, 0.0)  # empty group: 0/1
    return _broadcast((scores - baseline).masked_fill(_zero_variance(groups), 0.0), mask, groups)


@estimator("gpg", min_group_size=2)
def gpg(inp: AdvantageInput) -> AdvantageOutput:
    """GPG (2504.02546, eq. 9; α as verl implements it): A_i = α (s_i − mean_g s) / F_norm,
    α = batch size / max(1, samples with a non-zero score), F_norm = ``options.gpg_f_norm``.
    Needs ``group_ids`` ``[batch]``; advantages ``[batch, response_len]``."""
    mask, scores, groups = _scored_groups(inp, "gpg")
    alpha = len(scores) / max(1, int(torch.count_nonzero(scores)))
    return _broadcast(alpha * _centred(scores, groups) / inp.options.gpg_f_norm, mask, groups)


@estimator("grpo_passk", min_group_size=2)
def grpo_passk(inp: AdvantageInput) -> AdvantageOutput:
    """Pass@k GRPO (2503.19595, as verl implements it): each group's best response (first on ties) gets
    s_max − s_second, ÷ (std + ε) with the std of ``options.scale`` (the group's, the batch's, or none:
    verl's ``norm_adv_by_std_in_grpo=False``); the others get 0. Needs ``group_ids`` ``[batch]`` with >= 2
    responses per prompt."""
    mask, scores, groups = _scored_groups(inp, "grpo_passk")
    if bool((groups.size < 2).any()):
        raise ValueError("grpo_passk needs at least 2 responses per prompt (a lone one has no second best)")
    position = torch.arange(len(scores), device=scores.device)
    best = _per_group(scores, groups, "amax")
    first_best = _per_group(position.masked_fill(scores != best, len(scores)), groups, "amin")
    is_best = position == first_best
    second = _per_group(scores.masked_fill(is_best, -torch.inf), groups, "amax")
    gain = best - second
    if inp.options.scale == "group":
        gain = gain / (groups.std + inp.options.epsilon)
    elif inp.options.scale == "batch":
        gain = gain / (scores.std() + inp.options.epsilon)
    return _broadcast(gain.masked_fill(~is_best, 0.0), mask, groups)


@estimator("reinforce_pp_baseline", min_group_size=2)
def reinforce_pp_baseline(inp: AdvantageInput) -> AdvantageOutput:
    """REINFORCE++-baseline (2501.03262, as verl implements it): (s_i − mean_g s) broadcast over valid
    tokens, then whitened over all valid tokens of the batch. Needs ``group_ids`` ``[batch]``."""
    mask, scores, groups = _scored_groups(inp, "reinforce_pp_baseline")
    advantages = masked_whiten(_centred(scores, groups).unsqueeze(-1) * mask, mask)
    return AdvantageOutput(advantages=advantages, returns=advantages, zero_variance=_zero_variance(groups))


# ---------------------------------------------------------------------------- token-level returns
SCAN_BLOCK = 32  # tokens per matmul block of the discounted scan: 32 loop steps for 1,024 tokens


def _one_run_per_row(mask: torch.Tensor) -> bool:
    """True when every row's valid tokens are one contiguous run (no hole inside a response)."""
    valid = mask > 0
    runs = (valid[:, 1:] > valid[:, :-1]).sum(-1) + valid[:, 0]
    return bool((runs <= 1).all())


def _reverse_discounted_sum(x: torch.Tensor, decay: float) -> torch.Tensor:
    """y_t = x_t + decay · y_{t+1} along the last dim of ``[batch, T]`` (no reset), ``[batch, T]``.

    decay 1 is a reverse cumulative sum. Otherwise each block of ``SCAN_BLOCK`` tokens is solved by one
    matmul with the [L, L] matrix of decay^(k−t), and a reverse loop over blocks adds the carry: the
    same recursion as a per-token loop, in T/L Python steps instead of T, on batch-major memory.
    """
    if decay == 1.0:
        return x.flip(-1).cumsum_(-1).flip(-1)
    batch, length = x.shape
    block = SCAN_BLOCK
    padded = torch.nn.functional.pad(x, (0, -length % block))  # zeros after the end change nothing
    k = torch.arange(block, dtype=x.dtype, device=x.device)
    lag = k[:, None] - k[None, :]
    base = torch.tensor(decay, dtype=x.dtype, device=x.device)
    within = torch.where(lag >= 0, base ** lag.clamp(min=0), 0.0)  # [from k, to t]
    y = padded.view(batch, -1, block) @ within
    carry = base ** (block - k)  # weight of the next block's first y on each position of this block
    for j in range(y.shape[1] - 2, -1, -1):
        y[:, j].addcmul_(y[:, j + 1, :1], carry)
    y = y.view(batch, -1)
    return y if y.shape[1] == length else y[:, :length].contiguous()


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + γ G_{t'} on valid tokens, t' = the next *valid* token; 0 on masked tokens.

    ``[batch, response_len] -> [batch, response_len]``. Masked tokens inside a response (a multi-turn
    mask's tool output) are not steps: the return carries across them, so a reward at the end of the
    last turn reaches the earlier turns (as ``gae`` treats holes). Only the end of the row ends it.
    """
    rewards = rewards * mask
    if _one_run_per_row(mask):  # no hole inside a row: rewards are already 0 past its end
        return _reverse_discounted_sum(rewards, gamma).mul_(mask)
    # Time-major copies: the reverse loop then reads contiguous rows instead of 4 KiB-strided columns.
    rewards_t, valid_t = rewards.T.contiguous(), (mask > 0).T.contiguous()
    returns_t = torch.empty_like(rewards_t)
    running = rewards_t.new_zeros(rewards_t.shape[1])  # G at the next valid token
    for t in range(rewards_t.shape[0] - 1, -1, -1):
        step = torch.add(rewards_t[t], running, alpha=gamma)
        running = torch.where(valid_t[t], step, running, out=returns_t[t])  # a hole passes G through
    return returns_t.T.contiguous().mul_(mask)


@estimator("reinforce_pp")
def reinforce_pp(inp: AdvantageInput) -> AdvantageOutput:
    """REINFORCE++ (2501.03262, Sec. 3): G_t = Σ_{k≥t} γ^{k−t} r_k over the response's valid tokens
    (k counts valid tokens; masked ones inside are skipped, not restarts), advantages = whiten(G) over
    all valid tokens of the batch, returns = G. ``[batch, response_len]`` in and out; γ =
    ``options.gamma``."""
    mask = _token_mask(inp)
    returns = discounted_returns(inp.token_level_rewards, mask, inp.options.gamma)
    return AdvantageOutput(advantages=masked_whiten(returns, mask), returns=returns)


@estimator("remax", needs_baseline=True)
def remax(inp: AdvantageInput) -> AdvantageOutput:
    """ReMax (2310.10505, Alg. 1; as verl implements it): A_{i,t} = G_t − b_i, b_i = score of the greedy
    response to the prompt (``baseline_scores`` ``[batch]``), G as in reinforce_pp; returns = G."""
    mask = _token_mask(inp)
    baseline = _require(inp, "remax", "baseline_scores").to(mask.dtype)
    returns = discounted_returns(inp.token_level_rewards, mask, inp.options.gamma)
    return AdvantageOutput(advantages=(returns - baseline.unsqueeze(-1)) * mask, returns=returns)


def _gae_one_run(rewards, values, mask, gamma: float, lam: float) -> torch.Tensor:
    """Unwhitened GAE when each row is one contiguous run: the next valid token is simply t + 1."""
    next_values = torch.nn.functional.pad((values * mask)[:, 1:], (0, 1))  # V = 0 past the last token
    deltas = torch.add(rewards, next_values, alpha=gamma).sub_(values).mul_(mask)
    return _reverse_discounted_sum(deltas, gamma * lam).mul_(mask)


def _gae_with_holes(rewards, values, mask, gamma: float, lam: float) -> torch.Tensor:
    """Unwhitened GAE for any mask: a reverse loop over time that steps over masked positions."""
    valid_t = (mask > 0).T.contiguous()  # time-major, for contiguous rows in the loop
    values_t = values.T.contiguous()
    partial_t = (rewards - values).T.contiguous()  # δ_t without its γ V_next term
    adv_t = torch.empty_like(partial_t)
    next_value = partial_t.new_zeros(partial_t.shape[1])  # V and A at the next valid token; 0 past the end
    next_adv = partial_t.new_zeros(partial_t.shape[1])
    for t in range(partial_t.shape[0] - 1, -1, -1):
        step = torch.add(partial_t[t], next_value, alpha=gamma).add_(next_adv, alpha=gamma * lam)
        # a masked position carries the next valid token's A and V through to the previous one
        next_adv = torch.where(valid_t[t], step, next_adv, out=adv_t[t])
        next_value = torch.where(valid_t[t], values_t[t], next_value)
    return adv_t.T.contiguous().mul_(mask)  # drop the values carried on masked positions


@estimator("gae", needs_values=True)
def gae(inp: AdvantageInput) -> AdvantageOutput:
    """GAE (1506.02438, eqs. 11-16; as verl implements it): δ_t = r_t + γV_{t+1} − V_t,
    A_t = δ_t + γλA_{t+1}, where t+1 is the next valid token and V = A = 0 after the last one;
    returns = A + V (before whitening, 0 on masked tokens); advantages = whiten(A) over the batch's valid
    tokens. ``values`` ``[batch, response_len]``; γ, λ = ``options.gamma``, ``options.lam``."""
    mask = _token_mask(inp)
    values = _require(inp, "gae", "values").to(mask.dtype)
    compute = _gae_one_run if _one_run_per_row(mask) else _gae_with_holes
    adv = compute(inp.token_level_rewards, values, mask, inp.options.gamma, inp.options.lam)
    returns = (adv + values).mul_(mask)
    return AdvantageOutput(advantages=masked_whiten(adv, mask), returns=returns)
