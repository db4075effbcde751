"""KL estimators between the policy and the reference policy, and KL-coefficient controllers.

Per-token estimators of KL(π_θ ‖ π_ref) from sampled tokens, Δ = log π_θ − log π_ref
(Schulman, "Approximating KL divergence", 2020; docs/algorithms.md "KL estimators"):

=====================  =========================================================
``k1`` / ``kl``        Δ
``abs``                |Δ|
``k2`` / ``mse``       ½ Δ²
``k3`` / ``low_var_kl``exp(−Δ) + Δ − 1, clamped to [−10, 10]
``<name>+``            value of ``<name>``, gradient of ``k2`` (straight-through)
=====================  =========================================================

Where rlplat departs from verl: every registered name has a working ``+`` variant (verl's ``k3+`` falls
through to NotImplementedError), and ``k3`` clamps Δ to [−20, 20] before exponentiating so that a
far-off token yields the clamped value 10 instead of ``inf``. There is no exact ("full") estimator over the
vocabulary: the roles exchange per-token log-probs, never ``[batch, response_len, vocab]`` logits.

The estimate is used either in the reward (r_t − β·KL_t, see :func:`kl_penalized_rewards`) or in the loss
(β·aggregate(KL)); β comes from a :class:`FixedKLController` or an :class:`AdaptiveKLController`.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import torch

from rlplat.registry import Registry

LOG_RATIO_CLAMP = 20.0  # exp(20) ~ 5e8: beyond this k3 is clamped anyway; avoids inf/NaN gradients
K3_CLAMP = 10.0  # docs/algorithms.md: k3 clamped to [-10, 10] (as verl's low_var_kl)
STRAIGHT_THROUGH_SUFFIX = "+"


@dataclass
class KLInput:
    """Inputs of a KL estimator: ``[batch, response_len]`` log-probabilities of the sampled tokens."""

    log_prob: torch.Tensor
    ref_log_prob: torch.Tensor


KLEstimator = Callable[[KLInput], torch.Tensor]
KL_ESTIMATORS: Registry[KLEstimator] = Registry("KL estimator")


def _delta(inp: KLInput) -> torch.Tensor:
    return inp.log_prob - inp.ref_log_prob


@KL_ESTIMATORS.register("k1")
def k1(inp: KLInput) -> torch.Tensor:
    """k1 = Δ: unbiased, high variance, can be negative."""
    return _delta(inp)


@KL_ESTIMATORS.register("abs")
def abs_kl(inp: KLInput) -> torch.Tensor:
    """|Δ|."""
    return _delta(inp).abs()


@KL_ESTIMATORS.register("k2")
def k2(inp: KLInput) -> torch.Tensor:
    """k2 = ½ Δ²: biased, low variance; its gradient is the true KL gradient in expectation."""
    return 0.5 * _delta(inp).square()


@KL_ESTIMATORS.register("k3")
def k3(inp: KLInput) -> torch.Tensor:
    """k3 = exp(−Δ) + Δ − 1 ≥ 0: unbiased and low variance; clamped to [−10, 10]."""
    delta = _delta(inp).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(-delta) + delta - 1).clamp(-K3_CLAMP, K3_CLAMP)


# The names used by verl and the k-notation name the same estimators.
KL_ESTIMATORS.add("kl", k1)
KL_ESTIMATORS.add("mse", k2)
KL_ESTIMATORS.add("low_var_kl", k3)


def straight_through(estimator: KLEstimator) -> KLEstimator:
    """Forward value of ``estimator``, backward gradient of ``k2``: est.detach() + k2 − k2.detach()."""

    def estimate(inp: KLInput) -> torch.Tensor:
        grad_path = k2(inp)
        return estimator(inp).detach() + grad_path - grad_path.detach()

    estimate.__name__ = f"{getattr(estimator, '__name__', 'kl')}_straight_through"
    return estimate


def kl_estimator_names() -> tuple[str, ...]:
    """Every accepted name: the registered ones and their straight-through ``+`` variants."""
    base = KL_ESTIMATORS.names()
    return base + tuple(name + STRAIGHT_THROUGH_SUFFIX for name in base)


def get_kl_estimator(name: str) -> KLEstimator:
    base = name[: -len(STRAIGHT_THROUGH_SUFFIX)] if name.endswith(STRAIGHT_THROUGH_SUFFIX) else name
    if base not in KL_ESTIMATORS:
        raise KL_ESTIMATORS.unknown(name, kl_estimator_names())
    estimator = KL_ESTIMATORS.get(base)
    return straight_through(estimator) if base != name else estimator


def kl_penalty(name: str, inp: KLInput) -> torch.Tensor:
    """Per-token KL estimate ``[batch, response_len]`` with the named estimator."""
    return get_kl_estimator(name)(inp)


def kl_penalized_rewards(
    token_level_scores: torch.Tensor, kl: torch.Tensor, response_mask: torch.Tensor, beta: float
) -> torch.Tensor:
    """KL in the reward (Ziegler et al. 1909.08593, eq. 2): r_t = score_t − β·KL_t on valid tokens.

    All tensors ``[batch, response_len]``; ``kl`` is treated as a constant (detached).
    """
    mask = response_mask.to(token_level_scores.dtype)
    return (token_level_scores - beta * kl.detach()) * mask


class KLController(ABC):
    """Holds the KL coefficient β and updates it once per training step."""

    value: float

    @classmethod
    def from_options(cls, coef: float, target: float, horizon: float) -> KLController:
        """Build from the ``algorithm.kl_ctrl`` options; controllers ignore what they do not use."""
        return cls(coef)

    @abstractmethod
    def update(self, current_kl: float, n_steps: int) -> None:
        """``current_kl``: the step's mean KL; ``n_steps``: samples (or steps) since the last update."""


class FixedKLController(KLController):
    """A constant β."""

    def __init__(self, coef: float):
        self.value = float(coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        return None


class AdaptiveKLController(KLController):
    """Ziegler et al. (1909.08593, Sec. 2.2): β ← β·(1 + clip(KL/target − 1, −0.2, 0.2)·n/horizon)."""

    def __init__(self, coef: float, target: float, horizon: float):
        if target <= 0 or horizon <= 0:
            raise ValueError(f"adaptive KL needs target > 0 and horizon > 0, got {target=} {horizon=}")
        self.value = float(coef)
        self.target = float(target)
        self.horizon = float(horizon)

    @classmethod
    def from_options(cls, coef: float, target: float, horizon: float) -> KLController:
        return cls(coef, target, horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        if not math.isfinite(current_kl):
            raise ValueError(f"adaptive KL controller got a non-finite KL {current_kl}")
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


KL_CONTROLLERS: Registry[type[KLController]] = Registry("KL controller")
KL_CONTROLLERS.add("fixed", FixedKLController)
KL_CONTROLLERS.add("adaptive", AdaptiveKLController)


def make_kl_controller(kind: str, coef: float, target: float, horizon: float) -> KLController:
    """``kind``: ``fixed`` or ``adaptive`` (target KL and horizon used only by ``adaptive``); the defaults
    are the schema's ``algorithm.kl_ctrl``."""
    return KL_CONTROLLERS.get(kind).from_options(coef, target, horizon)
