"""Policy losses (per token, before aggregation), the clipped value loss, and entropy from logits.

Every policy loss has the same call, ``fn(PolicyLossInput) -> PolicyLossOutput``: a per-token loss
``[batch, response_len]`` (0 on masked tokens) and detached scalar metrics. Aggregation to a scalar is a
separate registry (:mod:`rlplat.algorithms.aggregation`). ratio r = exp(clamp(logp − old, −20, 20)).

Where rlplat departs from the papers:

* ``ppo``: ε_low and ε_high are decoupled (DAPO clip-higher), and the dual clip applies for A < 0.
* ``gspo``, ``geo_mean``: sequence-level objectives are spread over the sequence's valid tokens (each
  token carries the sequence loss), so ``seq-mean-token-mean`` aggregation gives the paper's objective.
* ``geo_mean`` reads ε_low/ε_high in log-ratio space (GMPO clips log r to [−ε_low, ε_high], e.g. 0.4).
* ``clip_cov`` / ``kl_cov`` follow verl's implementation of 2505.22617 (token selection by centred
  covariance of advantage and log-prob; random selection for clip_cov uses ``inp.generator``).
* Importance weights (e.g. a rollout/training mismatch correction) multiply the per-token loss as
  constants.

Metrics (masked means over valid tokens): ``clip_frac_upper`` / ``clip_frac_lower`` (share of tokens
where the upper / lower clip bound decides the loss), ``approx_kl`` (mean of old − logp), ``ratio_mean``,
``ratio_var``; losses without clipping report clip fractions of 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rlplat.algorithms.masked import masked_mean
from rlplat.registry import Registry

LOG_RATIO_CLAMP = 20.0  # exp(±20) keeps ratios finite; tokens that far off are clipped anyway


@dataclass(frozen=True)
class PolicyLossConfig:
    clip_ratio_low: float = 0.2  # ε_low
    clip_ratio_high: float = 0.2  # ε_high (decoupled: DAPO clip-higher uses 0.28)
    clip_ratio_c: float = 3.0  # dual-clip constant c (> 1)
    clip_cov_ratio: float = 2e-4  # clip_cov: share of valid tokens whose gradient is stopped
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 2e-3  # kl_cov: share of valid tokens that get the KL penalty
    kl_cov_coef: float = 1.0
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05

    def __post_init__(self):
        if self.clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must be > 1 (dual clip), got {self.clip_ratio_c}")


@dataclass
class PolicyLossInput:
    log_prob: torch.Tensor  # [batch, response_len] current policy (with grad)
    old_log_prob: torch.Tensor  # [batch, response_len] behaviour policy
    advantages: torch.Tensor  # [batch, response_len]
    response_mask: torch.Tensor  # [batch, response_len] bool or 0/1
    importance_weights: torch.Tensor | None = None  # [batch, response_len], used as constants
    config: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    generator: torch.Generator | None = None  # clip_cov's random token selection


@dataclass
class PolicyLossOutput:
    loss: torch.Tensor  # [batch, response_len], 0 on masked tokens, not aggregated
    metrics: dict[str, torch.Tensor]  # detached scalars


PolicyLoss = Callable[[PolicyLossInput], PolicyLossOutput]
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")


def get_policy_loss(name: str) -> PolicyLoss:
    return POLICY_LOSSES.get(name)


# ---------------------------------------------------------------------------- shared parts
def _log_ratio(inp: PolicyLossInput) -> torch.Tensor:
    return (inp.log_prob - inp.old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _finish(inp: PolicyLossInput, loss: torch.Tensor, ratio: torch.Tensor, upper=None, lower=None, **extra) -> PolicyLossOutput:
    """Apply importance weights and the mask; compute the metrics every loss reports."""
    mask = inp.response_mask.to(loss.dtype)
    if inp.importance_weights is not None:
        loss = loss * inp.importance_weights.detach()
    with torch.no_grad():
        zero = torch.zeros((), dtype=loss.dtype, device=loss.device)
        ratio_mean = masked_mean(ratio, mask)
        metrics = {
            "clip_frac_upper": masked_mean(upper.to(loss.dtype), mask) if upper is not None else zero,
            "clip_frac_lower": masked_mean(lower.to(loss.dtype), mask) if lower is not None else zero,
            "approx_kl": masked_mean(inp.old_log_prob - inp.log_prob, mask),
            "ratio_mean": ratio_mean,
            "ratio_var": masked_mean((ratio - ratio_mean) ** 2, mask),
            **{k: masked_mean(v.to(loss.dtype), mask) for k, v in extra.items()},
        }
    return PolicyLossOutput(loss=loss * mask, metrics={k: v.detach() for k, v in metrics.items()})


def _clipped(adv: torch.Tensor, ratio: torch.Tensor, low: float, high: float):
    """max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)), where the clipped term decides it, and where that is
    the upper / the lower bound."""
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1 - low, 1 + high)
    active = clipped > unclipped
    loss = torch.maximum(unclipped, clipped)
    return loss, active, active & (adv > 0) & (ratio > 1 + high), active & (adv < 0) & (ratio < 1 - low)


# ---------------------------------------------------------------------------- losses
@POLICY_LOSSES.register("ppo")
def ppo(inp: PolicyLossInput) -> PolicyLossOutput:
    """PPO clip (1707.06347, eq. 7) with decoupled ε_low/ε_high and dual clip (1912.09729, eq. 5):
    L = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)); for A < 0, L = min(L, −A·c)."""
    cfg = inp.config
    ratio = torch.exp(_log_ratio(inp))
    adv = inp.advantages
    loss, _, upper, lower = _clipped(adv, ratio, cfg.clip_ratio_low, cfg.clip_ratio_high)
    dual_bound = -adv * cfg.clip_ratio_c
    dual = (adv < 0) & (dual_bound < loss)
    loss = torch.where(adv < 0, torch.minimum(loss, dual_bound), loss)
    return _finish(inp, loss, ratio, upper, lower, dual_clip_frac=dual)


@POLICY_LOSSES.register("gspo")
def gspo(inp: PolicyLossInput) -> PolicyLossOutput:
    """GSPO (2507.18071, eq. 7-10): s_i = exp(mean_t(logp − old)); per token r' = sg(s_i)·exp(logp − sg(logp))
    (value s_i, gradient s_i·∇logp_t); L = max(−A·r', −A·clip(r', 1−ε_low, 1+ε_high)), no dual clip.
    Pair it with tiny ε (3e-4 / 4e-4) and ``seq-mean-token-mean`` aggregation (the gspo preset does)."""
    cfg, mask = inp.config, inp.response_mask.to(inp.log_prob.dtype)
    seq_log_ratio = masked_mean(_log_ratio(inp), mask, dim=-1)
    token_log_ratio = inp.log_prob - inp.log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(token_log_ratio.clamp(max=LOG_RATIO_CLAMP))
    loss, _, upper, lower = _clipped(inp.advantages, ratio, cfg.clip_ratio_low, cfg.clip_ratio_high)
    return _finish(inp, loss, ratio, upper, lower)


@POLICY_LOSSES.register("cispo")
def cispo(inp: PolicyLossInput) -> PolicyLossOutput:
    """CISPO (MiniMax-M1 2506.13585, eq. 4): L = −sg(clip(r, 1−ε_low, 1+ε_high))·A·logp."""
    cfg = inp.config
    ratio = torch.exp(_log_ratio(inp))
    weight = ratio.clamp(1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high).detach()
    loss = -weight * inp.advantages * inp.log_prob
    return _finish(inp, loss, ratio, ratio > 1 + cfg.clip_ratio_high, ratio < 1 - cfg.clip_ratio_low)


@POLICY_LOSSES.register("gpg")
def gpg(inp: PolicyLossInput) -> PolicyLossOutput:
    """GPG (2504.02546, eq. 8): L = −A·logp (plain policy gradient, no ratio, no clipping)."""
    return _finish(inp, -inp.advantages * inp.log_prob, torch.exp(_log_ratio(inp)).detach())


def _centred_covariance(inp: PolicyLossInput) -> torch.Tensor:
    """(A − mean A)(logp − mean logp) over valid tokens, detached (2505.22617, eq. 9)."""
    mask = inp.response_mask.to(inp.log_prob.dtype)
    adv, logp = inp.advantages.detach(), inp.log_prob.detach()
    return (adv - masked_mean(adv, mask)) * (logp - masked_mean(logp, mask))


@POLICY_LOSSES.register("clip_cov")
def clip_cov(inp: PolicyLossInput) -> PolicyLossOutput:
    """Clip-Cov (2505.22617, Sec. 4, as verl implements it): PPO clip loss, and the gradient is
    stopped on ``clip_cov_ratio`` of the valid tokens, drawn at random among the unclipped tokens
    whose covariance lies in (clip_cov_lb, clip_cov_ub)."""
    cfg, mask = inp.config, inp.response_mask.bool()
    ratio = torch.exp(_log_ratio(inp))
    loss, clipped, upper, lower = _clipped(inp.advantages, ratio, cfg.clip_ratio_low, cfg.clip_ratio_high)
    cov = _centred_covariance(inp)
    candidates = (mask & ~clipped & (cov > cfg.clip_cov_lb) & (cov < cfg.clip_cov_ub)).flatten().nonzero().squeeze(-1)
    count = min(max(1, int(cfg.clip_cov_ratio * int(mask.sum()))), len(candidates))
    pick = torch.randperm(len(candidates), generator=inp.generator)[:count].to(candidates.device)
    stopped = torch.zeros_like(mask).flatten()
    stopped[candidates[pick]] = True
    stopped = stopped.view_as(mask)
    loss = torch.where(stopped, loss.detach() * 0, loss)
    return _finish(inp, loss, ratio, upper, lower, clip_cov_frac=stopped)


@POLICY_LOSSES.register("kl_cov")
def kl_cov(inp: PolicyLossInput) -> PolicyLossOutput:
    """KL-Cov (2505.22617, Sec. 4, as verl implements it): L = −A·r (no clipping); the top
    ``kl_cov_ratio`` of valid tokens by covariance get + kl_cov_coef·|logp − old|."""
    cfg, mask = inp.config, inp.response_mask.bool()
    ratio = torch.exp(_log_ratio(inp))
    loss = -inp.advantages * ratio
    k = int(cfg.kl_cov_ratio * int(mask.sum()))
    penalised = torch.zeros_like(mask)
    if k > 0:
        cov = torch.where(mask, _centred_covariance(inp), torch.full_like(loss, -torch.inf))
        top = torch.topk(cov.flatten(), k).indices
        penalised.view(-1)[top] = True
        loss = loss + penalised * cfg.kl_cov_coef * (inp.log_prob - inp.old_log_prob).abs()
    return _finish(inp, loss, ratio, kl_cov_frac=penalised)


@POLICY_LOSSES.register("sapo")
def sapo(inp: PolicyLossInput) -> PolicyLossOutput:
    """SAPO (2511.20347, eq. 6): L = −g·A, g = σ(τ(r − 1))·4/τ, τ = τ_pos if A > 0 else τ_neg
    (a smooth gate instead of a hard clip; g'(1) = 1, so at r = 1 the gradient is PPO's)."""
    cfg = inp.config
    ratio = torch.exp(_log_ratio(inp))
    tau = torch.where(inp.advantages > 0, cfg.sapo_tau_pos, cfg.sapo_tau_neg).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1)) * 4 / tau
    return _finish(inp, -gate * inp.advantages, ratio)


@POLICY_LOSSES.register("geo_mean")
def geo_mean(inp: PolicyLossInput) -> PolicyLossOutput:
    """GMPO (2507.20673, eq. 5, as verl implements it): token log-ratios Δ clipped in log space,
    pessimistically by the sign of A: Δ' = sgn(A)·min(sgn(A)·Δ, sgn(A)·clamp(Δ, −ε_low, ε_high));
    ρ_i = exp(mean_t Δ'), Â_i = mean_t A; every valid token carries L = −Â_i·ρ_i."""
    cfg, mask = inp.config, inp.response_mask.to(inp.log_prob.dtype)
    delta = _log_ratio(inp)
    sign = torch.sign(inp.advantages)
    clamped = delta.clamp(-cfg.clip_ratio_low, cfg.clip_ratio_high)
    pessimistic = sign * torch.minimum(sign * delta, sign * clamped)
    seq_ratio = torch.exp(masked_mean(pessimistic, mask, dim=-1))
    seq_adv = masked_mean(inp.advantages, mask, dim=-1)
    loss = (-seq_adv * seq_ratio).unsqueeze(-1).expand_as(delta)
    upper = (inp.advantages > 0) & (delta > cfg.clip_ratio_high)
    lower = (inp.advantages < 0) & (delta < -cfg.clip_ratio_low)
    return _finish(inp, loss, torch.exp(delta), upper, lower)


# ---------------------------------------------------------------------------- critic and entropy
def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, response_mask: torch.Tensor,
    clip_range: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss (PPO, as in 2005.12729 Sec. 3): ½·max((V − R)², (clip(V, V_old ± ε_v) − R)²).

    All ``[batch, response_len]``; returns the per-token loss (0 on masked tokens) and metrics
    ``vf_clip_frac`` (share of tokens where the clipped term is larger) and ``vpred_mean``.
    """
    mask = response_mask.to(values.dtype)
    clipped = old_values + (values - old_values).clamp(-clip_range, clip_range)
    unclipped_sq, clipped_sq = (values - returns) ** 2, (clipped - returns) ** 2
    loss = 0.5 * torch.maximum(unclipped_sq, clipped_sq) * mask
    with torch.no_grad():
        metrics = {
            "vf_clip_frac": masked_mean((clipped_sq > unclipped_sq).to(values.dtype), mask),
            "vpred_mean": masked_mean(values, mask),
        }
    return loss, metrics


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """H = logsumexp(z) − Σ softmax(z)·z, ``[..., vocab] -> [...]`` (stable for large logits)."""
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(-1)


