"""Policy losses that bound a divergence instead of the probability ratio: DPPO (TV, binary KL) and DRO.

Same call and output as every policy loss (:mod:`rlplat.algorithms.policy_losses`): a per-token loss
``[batch, response_len]``, 0 on masked tokens, not aggregated, plus detached metrics. p = exp(logp) and
p_old = exp(old) are the probabilities of the sampled token; r = exp(clamp(logp − old, ±20)).
Formulas and config keys: docs/algorithms.md.

Where these depart from their sources:

* ``dppo_tv`` / ``dppo_kl`` (Qi et al., "Rethinking the Trust Region in LLM RL", 2602.04879): only the
  paper's *binary* divergence approximations (the sampled token vs the rest of the vocabulary), as verl
  implements them; the top-K approximation needs the full distributions. The divergence thresholds
  reuse ``clip_ratio_low`` / ``clip_ratio_high`` (the dppo presets set 0.15 for TV and 0.05 for KL) and
  the truncation cap of the importance weight reuses ``clip_ratio_c`` (the presets set 20).
* ``dro``: the per-token form verl ships: the DRO objective of Richemond et al. (2405.19107)
  with the *behaviour* policy in place of the reference policy, so the regulariser is a trust region.
"""

from __future__ import annotations

import torch

from rlplat.algorithms.policy_losses import POLICY_LOSSES, PolicyLossInput, PolicyLossOutput, _finish, _log_ratio

BINARY_KL_EPS = 1e-8  # keeps log(1 − p) finite when a token's probability rounds to 1


def _dppo(inp: PolicyLossInput, inside_positive: torch.Tensor, inside_negative: torch.Tensor) -> PolicyLossOutput:
    """L = −A · sg(min(r, c)) · logp · M, M = the trust-region mask for A's sign (A > 0: ``inside_positive``).

    The gradient is −A·min(r, c)·∇logp (PPO's −A·∇r below the cap) on tokens inside the region and 0
    outside, so a token is stopped by how far its *probability* moved, not its ratio.
    """
    cfg, adv = inp.config, inp.advantages
    ratio = torch.exp(_log_ratio(inp))
    truncated = ratio.clamp(max=cfg.clip_ratio_c).detach()  # truncated IS weight (paper Sec. 5.4)
    inside = torch.where(adv > 0, inside_positive, inside_negative).detach()
    loss = -adv * truncated * inp.log_prob * inside.to(ratio.dtype)
    outside = ~inside
    return _finish(inp, loss, ratio, outside & (adv > 0), outside & (adv <= 0),
                   truncated_frac=inside & (ratio > cfg.clip_ratio_c))


@POLICY_LOSSES.register("dppo_tv")
def dppo_tv(inp: PolicyLossInput) -> PolicyLossOutput:
    """DPPO-Binary-TV (2602.04879, as verl implements it): a token keeps its gradient while its
    probability has not moved past the threshold in the direction A pushes it: p − p_old <= δ_high for
    A > 0, p − p_old >= −δ_low otherwise (δ = ``clip_ratio_high`` / ``clip_ratio_low``); then
    L = −A · sg(min(r, c)) · logp on the kept tokens, 0 elsewhere. ``clip_frac_upper`` / ``_lower``:
    share of tokens outside the region with A > 0 / A <= 0; ``truncated_frac``: weight capped at c."""
    cfg = inp.config
    moved = torch.exp(inp.log_prob) - torch.exp(inp.old_log_prob)
    return _dppo(inp, moved <= cfg.clip_ratio_high, moved >= -cfg.clip_ratio_low)


@POLICY_LOSSES.register("dppo_kl")
def dppo_kl(inp: PolicyLossInput) -> PolicyLossOutput:
    """DPPO-Binary-KL (2602.04879, as verl implements it): the binary KL between the old and new
    Bernoulli (sampled token or not), D = p_old·log(p_old/p) + (1 − p_old)·log((1 − p_old)/(1 − p)),
    with 1e-8 added inside the second log. For A > 0 a token is inside while D <= δ_high or p <= p_old;
    for A <= 0 while D <= δ_low or p >= p_old. Loss and metrics as ``dppo_tv``."""
    cfg = inp.config
    p, p_old = torch.exp(inp.log_prob), torch.exp(inp.old_log_prob)
    binary_kl = p_old * (inp.old_log_prob - inp.log_prob) + (1 - p_old) * torch.log(
        (1 - p_old + BINARY_KL_EPS) / (1 - p + BINARY_KL_EPS)
    )
    inside_positive = (binary_kl <= cfg.clip_ratio_high) | (p <= p_old)  # A > 0 pushes p up: falling is fine
    inside_negative = (binary_kl <= cfg.clip_ratio_low) | (p >= p_old)
    return _dppo(inp, inside_positive, inside_negative)


@POLICY_LOSSES.register("dro")
def dro(inp: PolicyLossInput) -> PolicyLossOutput:
    """DRO (2405.19107, per-token form as verl implements it): L = −(A·logp − ½ β (logp − old)²),
    β = ``dro_beta``. Its gradient −(A − β(logp − old))·∇logp is DRO's policy gradient with the
    behaviour policy as the regulariser's anchor: the pull of A fades as the log-ratio reaches A/β."""
    log_ratio = inp.log_prob - inp.old_log_prob
    loss = -(inp.advantages * inp.log_prob - 0.5 * inp.config.dro_beta * log_ratio.square())
    return _finish(inp, loss, torch.exp(_log_ratio(inp)))
