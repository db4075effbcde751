"""Policy losses (per token, before aggregation), the clipped value loss, and entropy from logits.

Every policy loss has one call, ``fn(PolicyLossInput) -> PolicyLossOutput``: a per-token loss
``[batch, response_len]`` (0 on masked tokens, *not* aggregated: aggregation is its own registry,
:mod:`rlplat.algorithms.aggregation`) and detached scalar metrics. The token ratio is
r = exp(clamp(logp − old, −20, 20)); "sg" is stop-gradient. Formulas: ``docs/algorithms.md``.

Where each loss departs from its paper:

* ``ppo``: ε_low / ε_high are decoupled (DAPO clip-higher, 2503.14476) instead of PPO's single ε.
* ``gspo``: the sequence objective is spread over tokens (GSPO-token form, each valid token carries the
  clipped −A·s_i); the paper's behaviour needs tiny ε (3e-4 / 4e-4) and ``seq-mean-token-mean``
  aggregation, which the ``gspo`` preset sets, not this function.
* ``cispo``: the IS-weight bounds reuse ε_low / ε_high (set ε_low large for the paper's upper-only clip);
  the paper's optional token mask M is not implemented.
* ``gpg``: none here; GPG's α / F_norm scaling lives in the ``gpg`` advantage estimator.
* ``clip_cov``: follows verl, not the paper's pseudo-code: the gradient-stopped tokens are drawn at random
  among the unclipped tokens with lb < cov < ub; selection is within one call (one micro-batch).
* ``kl_cov``: follows verl: k = max(1, int(ratio · n_valid)) tokens, so a call with fewer than 1/ratio
  valid tokens still penalises one; default coefficient 0.1 (verl's); selection is within one call
  (one micro-batch).
* ``sapo``: the token-level soft gate only; τ is picked by the sign of each token's advantage.
* ``geo_mean``: ε is read in log space (GMPO clips log r to [−ε_low, ε_high], e.g. ε = 0.4, not the
  0.2 of ratio space); sequence advantage = masked token mean of A (verl); the sequence objective is
  spread over tokens, so ``seq-mean-token-mean`` aggregation gives the per-sequence objective.

Importance weights (e.g. a rollout/training mismatch correction) multiply every loss's per-token loss,
as constants.

Metrics (masked means over valid tokens, detached): ``clip_frac_upper`` / ``clip_frac_lower`` (share of
valid tokens where the upper / lower clip bound decides the loss; 0 for losses that do not clip),
``approx_kl`` (mean of old − logp), ``ratio_mean`` and ``ratio_var`` (Bessel) of the ratio the loss uses
(gspo: the sequence ratio s_i on each of its tokens; all others: the token ratio); plus ``dual_clip_frac``
(ppo), ``clip_cov_frac`` (clip_cov), ``kl_cov_frac`` (kl_cov).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rlplat.algorithms.masked import masked_mean, masked_var
from rlplat.registry import Registry

LOG_RATIO_CLAMP = 20.0  # exp(±20) keeps ratios finite; a token that far off policy is clipped anyway


@dataclass
class PolicyLossOptions:
    # Options of individual policy losses (docs/algorithms.md); each loss reads only its own. This class is
    # also the schema of the config section algorithm.policy_loss_options.
    clip_cov_ratio: float = 2e-4  # clip_cov: share of valid tokens whose gradient is stopped
    clip_cov_lb: float = 1.0  # clip_cov: candidates have clip_cov_lb < covariance < clip_cov_ub
    clip_cov_ub: float = 5.0  # clip_cov: upper bound of the candidates' covariance
    kl_cov_ratio: float = 2e-3  # kl_cov: share of valid tokens penalised (at least one)
    kl_cov_coef: float = 0.1  # kl_cov: weight of the |logp - old| penalty (verl's ppo_kl_coef default)
    sapo_tau_pos: float = 1.0  # sapo: gate temperature for positive advantages
    sapo_tau_neg: float = 1.05  # sapo: gate temperature for negative advantages
    dro_beta: float = 0.1  # dro: weight of the 1/2 (logp - old)^2 penalty (> 0)


@dataclass
class PolicyLossConfig(PolicyLossOptions):
    """Everything a policy loss reads: the clip ratios and the losses' own options."""

    clip_ratio_low: float = 0.2  # ε_low
    clip_ratio_high: float = 0.2  # ε_high (decoupled: DAPO clip-higher uses 0.28)
    clip_ratio_c: float = 3.0  # dual-clip constant c (> 1), 1912.09729

    def __post_init__(self):
        checks = [
            (self.clip_ratio_c > 1.0, f"clip_ratio_c must be > 1 (dual clip), got {self.clip_ratio_c}"),
            (self.clip_ratio_low >= 0 and self.clip_ratio_high >= 0,
             f"clip_ratio_low/high must be >= 0, got {self.clip_ratio_low}, {self.clip_ratio_high}"),
            (0 <= self.clip_cov_ratio <= 1, f"clip_cov_ratio must be in [0, 1], got {self.clip_cov_ratio}"),
            (0 <= self.kl_cov_ratio <= 1, f"kl_cov_ratio must be in [0, 1], got {self.kl_cov_ratio}"),
            (self.clip_cov_lb < self.clip_cov_ub,
             f"clip_cov_lb must be < clip_cov_ub, got {self.clip_cov_lb}, {self.clip_cov_ub}"),
            (self.kl_cov_coef >= 0, f"kl_cov_coef must be >= 0, got {self.kl_cov_coef}"),
            (self.dro_beta > 0, f"dro_beta must be > 0, got {self.dro_beta}"),
            (self.sapo_tau_pos > 0 and self.sapo_tau_neg > 0,
             f"sapo_tau_pos/neg must be > 0, got {self.sapo_tau_pos}, {self.sapo_tau_neg}"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


def policy_loss_config(algo) -> PolicyLossConfig:
    """The policy losses' options from the ``algorithm`` config section: ``clip_ratio_*`` and the mapping
    ``policy_loss_options``. Raises ValueError naming the first bad option."""
    options = algo.policy_loss_options
    return PolicyLossConfig(
        clip_ratio_low=algo.clip_ratio_low,
        clip_ratio_high=algo.clip_ratio_high,
        clip_ratio_c=algo.clip_ratio_c,
        **{key: options[key] for key in options},
    )


@dataclass
class PolicyLossInput:
    log_prob: torch.Tensor  # [batch, response_len] current policy (requires grad)
    old_log_prob: torch.Tensor  # [batch, response_len] behaviour policy
    advantages: torch.Tensor  # [batch, response_len]
    response_mask: torch.Tensor  # [batch, response_len] bool or 0/1
    importance_weights: torch.Tensor | None = None  # [batch, response_len], multiply the loss, detached
    config: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    generator: torch.Generator | None = None  # randomness of clip_cov's token selection


@dataclass
class PolicyLossOutput:
    loss: torch.Tensor  # [batch, response_len] per-token loss, 0 on masked tokens, not aggregated
    metrics: dict[str, torch.Tensor]  # detached scalars


PolicyLoss = Callable[[PolicyLossInput], PolicyLossOutput]
POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")


def get_policy_loss(name: str) -> PolicyLoss:
    """The registered policy loss ``name``; an unknown name lists the known ones (did you mean ...?)."""
    return POLICY_LOSSES.get(name)


# ---------------------------------------------------------------------------- shared parts
def _log_ratio(inp: PolicyLossInput) -> torch.Tensor:
    """clamp(logp − old, −20, 20), ``[batch, response_len]``."""
    return (inp.log_prob - inp.old_log_prob).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _clipped_surrogate(adv: torch.Tensor, ratio: torch.Tensor, cfg: PolicyLossConfig):
    """PPO's pessimistic surrogate max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)), all ``[batch, response_len]``.

    Returns ``(loss, clipped, upper, lower)``: ``clipped`` where the clipped term is strictly larger
    (so the bound decides the loss and the token has no gradient), split into the upper bound (A > 0,
    r > 1+ε_high) and the lower bound (A < 0, r < 1−ε_low).
    """
    unclipped = -adv * ratio
    clipped_term = -adv * ratio.clamp(1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high)
    clipped = clipped_term > unclipped
    loss = torch.maximum(unclipped, clipped_term)
    return loss, clipped, clipped & (adv > 0), clipped & (adv < 0)


def _centred_covariance(inp: PolicyLossInput) -> torch.Tensor:
    """(A − mean A)·(logp − mean logp), means over the valid tokens of the call; detached.

    The per-token covariance term of 2505.22617 (Sec. 4, Clip-Cov / KL-Cov), ``[batch, response_len]``.
    """
    mask = inp.response_mask
    adv, logp = inp.advantages.detach(), inp.log_prob.detach()
    return (adv - masked_mean(adv, mask)) * (logp - masked_mean(logp, mask))


def _finish(inp: PolicyLossInput, loss: torch.Tensor, ratio: torch.Tensor, upper=None, lower=None,
            **extra: torch.Tensor) -> PolicyLossOutput:
    """Apply the importance weights and the mask; compute the metrics every loss reports.

    ``upper`` / ``lower`` / ``extra`` are bool ``[batch, response_len]`` token sets reported as their
    share of the valid tokens (a missing clip set reports 0).
    """
    valid = inp.response_mask.bool()
    if inp.importance_weights is not None:
        loss = loss * inp.importance_weights.detach()
    loss = torch.where(valid, loss, torch.zeros((), dtype=loss.dtype, device=loss.device))
    with torch.no_grad():
        dtype = torch.promote_types(loss.dtype, torch.float32)  # bf16 cannot even count 65k tokens
        no_tokens = torch.zeros_like(valid)
        shares = {"clip_frac_upper": no_tokens if upper is None else upper,
                  "clip_frac_lower": no_tokens if lower is None else lower, **extra}
        metrics = {name: masked_mean(tokens.to(dtype), valid) for name, tokens in shares.items()}
        metrics["approx_kl"] = masked_mean((inp.old_log_prob - inp.log_prob).to(dtype), valid)
        metrics["ratio_mean"] = masked_mean(ratio.to(dtype), valid)
        metrics["ratio_var"] = masked_var(ratio.to(dtype), valid)
    return PolicyLossOutput(loss=loss, metrics={k: v.detach() for k, v in metrics.items()})


def _random_subset(candidates: torch.Tensor, count: int, generator: torch.Generator | None) -> torch.Tensor:
    """``min(count, #candidates)`` of the set entries of bool ``candidates``, uniformly at random."""
    index = candidates.flatten().nonzero().squeeze(-1)
    device = generator.device if generator is not None else torch.device("cpu")
    pick = torch.randperm(index.numel(), generator=generator, device=device)[:count].to(index.device)
    chosen = torch.zeros(candidates.numel(), dtype=torch.bool, device=candidates.device)
    chosen[index[pick]] = True
    return chosen.view_as(candidates)


def _top_k(scores: torch.Tensor, valid: torch.Tensor, k: int) -> torch.Tensor:
    """Bool mask of the ``k`` largest ``scores`` among the ``valid`` entries (k <= #valid)."""
    chosen = torch.zeros(scores.numel(), dtype=torch.bool, device=scores.device)
    if k > 0:
        ranked = torch.where(valid, scores, torch.full_like(scores, -torch.inf))
        chosen[torch.topk(ranked.flatten(), k).indices] = True
    return chosen.view_as(scores)


# ---------------------------------------------------------------------------- losses
@POLICY_LOSSES.register("ppo")
def ppo(inp: PolicyLossInput) -> PolicyLossOutput:
    """PPO clip (1707.06347, eq. 7) with decoupled ε_low / ε_high (DAPO 2503.14476, clip-higher) and the
    dual clip (1912.09729, dual-clip PPO): L = max(−A·r, −A·clip(r, 1−ε_low, 1+ε_high)); for A < 0 also
    L = min(L, −A·c). Extra metric ``dual_clip_frac``: share of valid tokens where −A·c decides."""
    cfg, adv = inp.config, inp.advantages
    ratio = torch.exp(_log_ratio(inp))
    loss, _, upper, lower = _clipped_surrogate(adv, ratio, cfg)
    dual_bound = -adv * cfg.clip_ratio_c  # > 0 for A < 0: caps how much a negative token can be pushed down
    dual = (adv < 0) & (dual_bound < loss)
    loss = torch.where(dual, dual_bound, loss)
    return _finish(inp, loss, ratio, upper, lower, dual_clip_frac=dual)


@POLICY_LOSSES.register("gspo")
def gspo(inp: PolicyLossInput) -> PolicyLossOutput:
    """GSPO (2507.18071; GSPO-token form, Sec. 4): s_i = exp(masked mean_t(logp − old)); per token
    r' = sg(s_i)·exp(logp − sg(logp)), whose value is s_i and gradient s_i·∇logp_t;
    L = max(−A·r', −A·clip(r', 1−ε_low, 1+ε_high)), no dual clip. Meant for tiny ε (3e-4 / 4e-4) and
    ``seq-mean-token-mean`` aggregation (the gspo preset sets both)."""
    seq_log_ratio = masked_mean(_log_ratio(inp), inp.response_mask, dim=-1)  # [batch], within ±20
    token_log_ratio = inp.log_prob - inp.log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(token_log_ratio)
    loss, _, upper, lower = _clipped_surrogate(inp.advantages, ratio, inp.config)
    return _finish(inp, loss, ratio, upper, lower)


@POLICY_LOSSES.register("cispo")
def cispo(inp: PolicyLossInput) -> PolicyLossOutput:
    """CISPO (MiniMax-M1 2506.13585, Sec. 3.1): L = −sg(clip(r, 1−ε_low, 1+ε_high))·A·logp.

    The clipped IS weight scales a REINFORCE gradient, so every token keeps a gradient (−clip(r)·A);
    the clip fractions count tokens whose weight is clipped at the upper / lower bound, whatever A's sign.
    """
    cfg = inp.config
    ratio = torch.exp(_log_ratio(inp))
    weight = ratio.clamp(1 - cfg.clip_ratio_low, 1 + cfg.clip_ratio_high).detach()
    loss = -weight * inp.advantages * inp.log_prob
    return _finish(inp, loss, ratio, ratio > 1 + cfg.clip_ratio_high, ratio < 1 - cfg.clip_ratio_low)


@POLICY_LOSSES.register("gpg")
def gpg(inp: PolicyLossInput) -> PolicyLossOutput:
    """GPG (2504.02546, Sec. 3): L = −A·logp, the plain policy gradient (no ratio, no clipping): the
    ``reinforce`` loss; GPG's own part is the α / F_norm scaling of the ``gpg`` advantage estimator."""
    return reinforce(inp)


@POLICY_LOSSES.register("reinforce")
def reinforce(inp: PolicyLossInput) -> PolicyLossOutput:
    """REINFORCE (Williams 1992, eq. 11 as a loss): L = −A·logp, no ratio and no clipping; gradient
    −A·∇logp. The same per-token loss as ``gpg``; ``importance_weights`` (e.g. a truncated rollout
    correction) multiply it as constants, as in verl's ``reinforce``. The ratio is reported only."""
    return _finish(inp, -inp.advantages * inp.log_prob, torch.exp(_log_ratio(inp)))


@POLICY_LOSSES.register("clip_cov")
def clip_cov(inp: PolicyLossInput) -> PolicyLossOutput:
    """Clip-Cov (2505.22617, Sec. 4, as verl implements it): the PPO surrogate max(pg1, pg2) (no dual
    clip), and the loss (value and gradient) is zeroed on max(1, int(clip_cov_ratio·n_valid)) tokens
    drawn at random with ``inp.generator`` among the valid, unclipped (pg2 <= pg1) tokens with
    clip_cov_lb < cov < clip_cov_ub (fewer if fewer qualify). Extra metric ``clip_cov_frac``."""
    cfg, valid = inp.config, inp.response_mask.bool()
    ratio = torch.exp(_log_ratio(inp))
    loss, clipped, upper, lower = _clipped_surrogate(inp.advantages, ratio, cfg)
    cov = _centred_covariance(inp)
    candidates = valid & ~clipped & (cov > cfg.clip_cov_lb) & (cov < cfg.clip_cov_ub)
    count = max(1, int(cfg.clip_cov_ratio * int(valid.sum())))
    stopped = _random_subset(candidates, count, inp.generator)
    loss = loss * (~stopped).to(loss.dtype)
    return _finish(inp, loss, ratio, upper, lower, clip_cov_frac=stopped)


@POLICY_LOSSES.register("kl_cov")
def kl_cov(inp: PolicyLossInput) -> PolicyLossOutput:
    """KL-Cov (2505.22617, Sec. 4, as verl implements it): L = −A·r on every token (no clipping), plus
    kl_cov_coef·|logp − old| on the k = max(1, int(kl_cov_ratio·n_valid)) valid tokens of largest
    covariance (k = 0 only when no token is valid or kl_cov_ratio = 0). Extra metric ``kl_cov_frac``."""
    cfg, valid = inp.config, inp.response_mask.bool()
    ratio = torch.exp(_log_ratio(inp))
    n_valid = int(valid.sum())
    # the floor of 1: without it a micro-batch of < 1/ratio tokens (500 at the default) penalises none
    k = min(n_valid, max(1, int(cfg.kl_cov_ratio * n_valid))) if cfg.kl_cov_ratio > 0 else 0
    penalised = _top_k(_centred_covariance(inp), valid, k)
    abs_kl = (inp.log_prob - inp.old_log_prob).abs()
    loss = -inp.advantages * ratio + cfg.kl_cov_coef * abs_kl * penalised.to(ratio.dtype)
    return _finish(inp, loss, ratio, kl_cov_frac=penalised)


@POLICY_LOSSES.register("sapo")
def sapo(inp: PolicyLossInput) -> PolicyLossOutput:
    """SAPO (2511.20347, Sec. 3): L = −g·A, g = σ(τ(r − 1))·4/τ, τ = τ_pos if A > 0 else τ_neg.

    A smooth gate instead of a hard clip: g'(r) = 4σ(1 − σ), so g'(1) = 1 and at r = 1 the gradient is
    PPO's (−A·∇r); it decays smoothly as r leaves 1 instead of dropping to zero at a bound.
    """
    cfg = inp.config
    ratio = torch.exp(_log_ratio(inp))
    # τ built in the ratio's dtype: a float32 1.05 would be off by 5e-8 in a float64 loss
    tau_pos, tau_neg = ratio.new_tensor(cfg.sapo_tau_pos), ratio.new_tensor(cfg.sapo_tau_neg)
    tau = torch.where(inp.advantages > 0, tau_pos, tau_neg)
    gate = torch.sigmoid(tau * (ratio - 1)) * 4 / tau
    return _finish(inp, -gate * inp.advantages, ratio)


@POLICY_LOSSES.register("geo_mean")
def geo_mean(inp: PolicyLossInput) -> PolicyLossOutput:
    """GMPO (2507.20673, Sec. 3, as verl implements it): token log-ratios Δ = logp − old are clipped in
    LOG space, pessimistically by the sign of A: Δ' = sgn(A)·min(sgn(A)·Δ, sgn(A)·clamp(Δ, −ε_low, ε_high));
    ρ_i = exp(masked mean_t Δ'), Â_i = masked mean_t A; every valid token carries L = −Â_i·ρ_i, so
    ``seq-mean-token-mean`` aggregation gives the per-sequence objective. ε is in log space (GMPO: 0.4)."""
    cfg, mask = inp.config, inp.response_mask
    delta = _log_ratio(inp)
    sign = torch.sign(inp.advantages)
    bounded = delta.clamp(-cfg.clip_ratio_low, cfg.clip_ratio_high)
    pessimistic = sign * torch.minimum(sign * delta, sign * bounded)
    seq_ratio = torch.exp(masked_mean(pessimistic, mask, dim=-1))  # ρ_i, [batch]
    seq_adv = masked_mean(inp.advantages, mask, dim=-1)  # Â_i, [batch]
    loss = (-seq_adv * seq_ratio).unsqueeze(-1).expand_as(delta)
    upper = (inp.advantages > 0) & (delta > cfg.clip_ratio_high)
    lower = (inp.advantages < 0) & (delta < -cfg.clip_ratio_low)
    return _finish(inp, loss, torch.exp(delta), upper, lower)


# ---------------------------------------------------------------------------- critic and entropy
def value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, response_mask: torch.Tensor,
    clip_range: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss of PPO implementations (2005.12729, Sec. 3, "value function clipping"):
    ½·max((V − R)², (clip(V, V_old − ε_v, V_old + ε_v) − R)²).

    ``values``, ``old_values``, ``returns``, ``response_mask``: ``[batch, response_len]``. Returns the
    per-token loss ``[batch, response_len]`` (0 on masked tokens, not aggregated) and detached scalar
    metrics ``vf_clip_frac`` (share of valid tokens where the clipped term is larger) and ``vpred_mean``.
    """
    valid = response_mask.bool()
    clipped = old_values + (values - old_values).clamp(-clip_range, clip_range)
    unclipped_sq, clipped_sq = (values - returns) ** 2, (clipped - returns) ** 2
    loss = torch.where(valid, 0.5 * torch.maximum(unclipped_sq, clipped_sq), torch.zeros_like(values))
    with torch.no_grad():
        metrics = {
            "vf_clip_frac": masked_mean((clipped_sq > unclipped_sq).to(values.dtype), valid),
            "vpred_mean": masked_mean(values, valid),
        }
    return loss, metrics


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(z): H = logsumexp(z) − Σ softmax(z)·z, ``[..., vocab] -> [...]``.

    Equal to −Σ p·log p without forming log p. z is first shifted by its max (H is shift-invariant), so
    both terms stay O(log vocab) and do not cancel catastrophically when logits are large (float32 at
    |z| ~ 1e4 would otherwise lose every digit); the dot product avoids a second ``[..., vocab]`` temporary.
    """
    shifted = logits - logits.detach().amax(dim=-1, keepdim=True)
    probs = torch.softmax(shifted, dim=-1)
    return torch.logsumexp(shifted, dim=-1) - torch.linalg.vecdot(probs, shifted)
