"""Off-policy corrections: weights that correct the policy loss for tokens another policy sampled.

The rollout engine samples with μ (its log-probs: ``rollout_log_probs``); the loss's ratio is taken against
π_old (the trainer's log-probs of the same tokens). They differ when the engine's kernels or precision
differ from the trainer's (vLLM, bf16) and, in asynchronous training, when μ is an older policy. Per
response token, with log-ratios clamped to ±20 (``LOG_RATIO_CLAMP``):

    ρ_t = π_old(y_t) / μ(y_t)
    level token:      ρ_t for each token
    level sequence:   ρ_seq = exp Σ_t log ρ_t, one value for every token of the response
    level geometric:  ρ_geo = exp mean_t log ρ_t (length-invariant; AReaL, slime)

and ``algorithm.off_policy.correction`` (registry :data:`OFF_POLICY_CORRECTIONS`) turns ρ into the weight
w that multiplies each token's policy loss (detached; r = π_θ / π_old is unchanged: the decoupled form):

=========  ======================================  ==============================================================
``none``   w = 1 (the mismatch metrics only)
``tis``    w = min(ρ, cap)                          truncated IS: Yao et al. 2025, "Your Efficient RL Framework
                                                    Secretly Brings You Off-Policy RL Training" (verl
                                                    ``rollout_is``, TRL ``token_truncate``)
``mis``    w = ρ · 1[low ≤ ρ ≤ high]                masked IS: Liu, Li et al. 2025, "When Speed Kills Stability"
                                                    (TRL ``sequence_mask``)
``icepop`` token-level ``mis``                      Ling team 2025 (arXiv 2510.18855), [0.5, 5] as verl's default
=========  ======================================  ==============================================================

A masked token stays in the loss's denominator (its numerator is zero), as TRL, SkyRL, AReaL, slime and
verl's IcePop do. Metrics, token means over the response tokens: ``rollout/log_prob_abs_diff`` (|log ρ|),
``rollout/mismatch_kl`` (k1 = log μ − log π_old, an estimate of KL(μ ‖ π_old) on μ's samples),
``rollout/mismatch_k3`` (ρ − log ρ − 1), ``off_policy/weight_mean``, ``off_policy/ratio_high_frac`` and
``off_policy/ratio_low_frac`` (ρ above the cap or ``high``, below ``low``: the tails), and
``off_policy/masked_frac`` (weights set to zero). Formulas and sources: ALGORITHMS "Rollout/training
mismatch and staleness corrections", docs/algorithms.md "Off-policy corrections".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlplat.algorithms.masked import masked_mean, masked_sum
from rlplat.registry import Registry

LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 5e8, far above any cap or threshold: keeps ρ finite
LEVELS = ("token", "sequence", "geometric")


@dataclass
class OffPolicyInput:
    """``[batch, response_len]`` log-probs of the sampled tokens under π_old and μ, and the response mask."""

    old_log_probs: torch.Tensor
    rollout_log_probs: torch.Tensor
    response_mask: torch.Tensor
    level: str = "token"
    cap: float = 2.0  # tis
    low: float = 0.5  # mis, icepop
    high: float = 5.0  # mis, icepop

    def log_ratio(self) -> torch.Tensor:
        """log ρ_t per token, clamped to ±LOG_RATIO_CLAMP, 0 on padding."""
        diff = (self.old_log_probs.detach() - self.rollout_log_probs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        return diff.masked_fill(~self.response_mask.bool(), 0.0)

    def ratio(self) -> torch.Tensor:
        """ρ at the input's level, ``[batch, response_len]`` (1 on padding)."""
        log_ratio, mask = self.log_ratio(), self.response_mask
        if self.level == "token":
            per_token = log_ratio
        elif self.level == "sequence":
            per_token = masked_sum(log_ratio, mask, -1)[:, None].expand_as(log_ratio)
        elif self.level == "geometric":
            per_token = masked_mean(log_ratio, mask, -1)[:, None].expand_as(log_ratio)
        else:
            raise ValueError(f"off-policy level must be one of {', '.join(LEVELS)}, got {self.level!r}")
        return per_token.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP).exp().masked_fill(~mask.bool(), 1.0)


@dataclass
class Correction:
    """The loss weights (None: none) and the token-mean metrics (0-dim tensors) of a correction."""

    weights: torch.Tensor | None
    metrics: dict[str, torch.Tensor]


OffPolicyCorrection = Callable[[OffPolicyInput], Correction]
OFF_POLICY_CORRECTIONS: Registry[OffPolicyCorrection] = Registry("off-policy correction")


def mismatch_metrics(inp: OffPolicyInput) -> dict[str, torch.Tensor]:
    """How far μ is from π_old on the sampled tokens, whatever the correction."""
    log_ratio, mask = inp.log_ratio(), inp.response_mask
    return {"rollout/log_prob_abs_diff": masked_mean(log_ratio.abs(), mask),
            "rollout/mismatch_kl": masked_mean(-log_ratio, mask),
            "rollout/mismatch_k3": masked_mean(log_ratio.exp() - log_ratio - 1.0, mask)}


@OFF_POLICY_CORRECTIONS.register("none")
def no_correction(inp: OffPolicyInput) -> Correction:
    return Correction(None, mismatch_metrics(inp))


@OFF_POLICY_CORRECTIONS.register("tis")
def truncated_importance_sampling(inp: OffPolicyInput) -> Correction:
    """w = min(ρ, cap)."""
    ratio, mask = inp.ratio(), inp.response_mask
    weights = ratio.clamp(max=inp.cap)
    return Correction(weights, {**mismatch_metrics(inp), "off_policy/weight_mean": masked_mean(weights, mask),
                                "off_policy/ratio_high_frac": masked_mean((ratio > inp.cap).to(ratio.dtype), mask)})


@OFF_POLICY_CORRECTIONS.register("mis")
def masked_importance_sampling(inp: OffPolicyInput) -> Correction:
    """w = ρ · 1[low ≤ ρ ≤ high]."""
    ratio, mask = inp.ratio(), inp.response_mask
    high, low = (ratio > inp.high).to(ratio.dtype), (ratio < inp.low).to(ratio.dtype)
    weights = ratio * (1.0 - high) * (1.0 - low)
    return Correction(weights, {**mismatch_metrics(inp), "off_policy/weight_mean": masked_mean(weights, mask),
                                "off_policy/ratio_high_frac": masked_mean(high, mask),
                                "off_policy/ratio_low_frac": masked_mean(low, mask),
                                "off_policy/masked_frac": masked_mean(high + low, mask)})


@OFF_POLICY_CORRECTIONS.register("icepop")
def icepop(inp: OffPolicyInput) -> Correction:
    """Token-level ``mis`` (the level must be ``token``)."""
    if inp.level != "token":
        raise ValueError(f"icepop masks tokens (level token), got level {inp.level!r}; use correction mis for "
                         f"a {inp.level}-level mask")
    return masked_importance_sampling(inp)
