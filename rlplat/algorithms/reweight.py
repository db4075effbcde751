"""PF-PPO sample reweighting: resample a batch's responses with weights that favour reliable rewards.

Policy Filtration for PPO (Shen et al., 2409.06957, Sec. 4): responses whose reward is extreme are the
ones a reward model scores reliably, so training on them more often helps. As verl implements it, the
whole batch (after advantages are computed) is resampled *with replacement* to its own size, with
weights from the sequence scores s_i (docs/algorithms.md, "PF-PPO"):

==============  ======================================================================
``pow``         w_i = |s_i|^p, p = ``weight_pow``
``max_min``     w_i = 1 if s_i is the batch's maximum or minimum score, else 0
``max_random``  w_i = 0.4 if s_i is the batch's maximum score, else 0.1
==============  ======================================================================

Every weight gets +1e-8, so an all-zero weight vector (e.g. ``pow`` with every score 0) resamples
uniformly instead of failing.
"""

from __future__ import annotations

import torch

PF_PPO_METHODS = ("pow", "max_min", "max_random")
WEIGHT_FLOOR = 1e-8  # verl's: every response keeps a tiny chance, and the weights never sum to 0


def pf_ppo_weights(scores: torch.Tensor, method: str, weight_pow: float) -> torch.Tensor:
    """Sampling weights ``[batch]`` of the ``[batch]`` sequence scores (before the floor)."""
    if method == "pow":
        return scores.abs().pow(weight_pow)
    if method == "max_min":
        return ((scores == scores.max()) | (scores == scores.min())).to(scores.dtype)
    if method == "max_random":
        return torch.where(scores == scores.max(), 0.4, 0.1).to(scores.dtype)
    raise ValueError(f"PF-PPO reweight method {method!r} is not one of {PF_PPO_METHODS}")


def pf_ppo_resample(scores: torch.Tensor, method: str, weight_pow: float,
                    generator: torch.Generator | None = None) -> torch.Tensor:
    """Indices ``[batch]`` (int64) of a with-replacement resample of the batch, P(i) ∝ w_i + 1e-8."""
    if scores.dim() != 1 or scores.numel() == 0:
        raise ValueError(f"scores must be a non-empty [batch] tensor, got shape {tuple(scores.shape)}")
    weights = pf_ppo_weights(scores.double(), method, weight_pow) + WEIGHT_FLOOR
    return torch.multinomial(weights, scores.numel(), replacement=True, generator=generator)
