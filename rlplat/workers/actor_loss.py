"""The actor's and critic's losses for one micro-batch, assembled from the algorithms registries.

actor loss = agg(w · policy loss) − entropy_coeff · agg(entropy) + kl_loss_coef · agg(KL)   (if use_kl_loss)
    w = the off-policy correction's weight of each token from π_old / π_rollout
    (``algorithm.off_policy``, :mod:`rlplat.algorithms.off_policy`: tis, mis, icepop), else 1: it corrects
    for the rollout engine's probabilities differing from the trainer's
    + aux_loss_coef · L_aux   (a mixture of experts: the routers' load-balancing loss, :mod:`rlplat.models.moe`,
    each micro-batch's weighted by its share of the mini-batch's response tokens; L_aux is not a sum over
    tokens, so this term alone depends on the micro-batch split)
critic loss = agg(½ max((V − R)², (clip(V, V_old ± ε_v) − R)²))
SFT loss    = token-mean(−log π(token))   (the warm start of the embedded model; + the same L_aux term)

Every ``agg`` uses the *mini-batch's* global denominators, so the micro-batch losses (and their
gradients) add up to the mini-batch's exactly; metrics are weighted the same way, so summing a
metric over micro-batches and ranks gives its mini-batch mean.
"""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from rlplat.algorithms import (
    OFF_POLICY_CORRECTIONS,
    KLInput,
    OffPolicyInput,
    LossDenominators,
    PolicyLossInput,
    aggregate_loss,
    get_policy_loss,
    kl_penalty,
    policy_loss_config,
    value_loss,
)
from rlplat.engines.base import ForwardOutput
from rlplat.engines.routing import router_loss_share
from rlplat.protocol import Batch


def _weighted(metrics: dict[str, torch.Tensor], mask: torch.Tensor, denominators: LossDenominators) -> dict[str, float]:
    """Token-mean metrics of a micro-batch, weighted by its share of the mini-batch's tokens."""
    share = router_loss_share(mask, denominators.num_tokens)
    return {k: float(v) * share for k, v in metrics.items()}


def actor_loss(
    fwd: ForwardOutput,
    micro: Batch,
    algo: DictConfig,
    denominators: LossDenominators,
    loss_scale_factor: float,
    entropy_coeff: float = 0.0,
    old_policy: str = "update",
) -> tuple[torch.Tensor, dict[str, float]]:
    """``old_policy`` is :attr:`rlplat.config.plan.RunPlan.old_policy`; π_old is read as
    :func:`old_log_probs_key` says, or is this forward's own, detached (an update that starts on the policy
    that sampled)."""
    t = micro.tensors
    mask = t["response_mask"].to(fwd.log_probs.device)
    key = old_log_probs_key(t, old_policy)
    old = t[key].to(mask.device) if key else fwd.log_probs.detach()
    from_rollout = key == "rollout_log_probs"

    def agg(values: torch.Tensor) -> torch.Tensor:
        return aggregate_loss(values, mask, algo.loss_agg_mode, denominators, loss_scale_factor)

    # π_old taken from the rollout has no mismatch to measure or correct
    weights, mismatch = (None, {}) if from_rollout else rollout_correction(old, t, mask, algo.off_policy)
    policy = get_policy_loss(algo.policy_loss)(
        PolicyLossInput(
            log_prob=fwd.log_probs,
            old_log_prob=old,
            advantages=t["advantages"].to(mask.device),
            response_mask=mask,
            importance_weights=weights,
            config=policy_loss_config(algo),
        )
    )
    pg_loss = agg(policy.loss)
    loss = pg_loss
    metrics = {f"actor/{k}": v for k, v in _weighted(policy.metrics, mask, denominators).items()}
    metrics.update(_weighted(mismatch, mask, denominators))
    metrics["actor/pg_loss"] = float(pg_loss.detach())
    if fwd.entropy is not None:
        entropy = agg(fwd.entropy if entropy_coeff else fwd.entropy.detach())
        metrics["actor/entropy"] = float(entropy.detach())
        if entropy_coeff:
            loss = loss - entropy_coeff * entropy
    if algo.use_kl_loss:
        kl = kl_penalty(algo.kl_loss_type, KLInput(fwd.log_probs, t["ref_log_probs"].to(mask.device)))
        kl_loss = agg(kl)
        loss = loss + algo.kl_loss_coef * kl_loss
        metrics["actor/kl_loss"] = float(kl_loss.detach())
    return _with_router_loss(loss, metrics, fwd, mask, denominators)


def _with_router_loss(loss: torch.Tensor, metrics: dict[str, float], fwd: ForwardOutput, mask: torch.Tensor,
                      denominators: LossDenominators) -> tuple[torch.Tensor, dict[str, float]]:
    """A mixture of experts' micro-batch: its load-balancing loss and routing metrics (:attr:`ForwardOutput.router_loss`)
    weighted by its share of the mini-batch's response tokens, so they add up to the mini-batch's mean."""
    if fwd.router_loss is None:
        return loss, metrics
    share = router_loss_share(mask, denominators.num_tokens)
    return loss + share * fwd.router_loss, {**metrics, **{k: v * share for k, v in fwd.router_metrics.items()}}


def old_log_probs_key(t, old_policy: str) -> str | None:
    """The batch field that holds π_old of the PPO ratio ``[batch, response_len]``, per
    :attr:`rlplat.config.plan.RunPlan.old_policy`: ``old_log_probs`` (the actor's pass; a batch that has them
    uses them), ``rollout_log_probs`` ("rollout"), or None ("update": the update's own forward). Every
    reader of π_old (the loss, a KL in the reward) asks here."""
    if "old_log_probs" in t.keys():
        return "old_log_probs"
    if old_policy == "update":
        return None
    if old_policy == "rollout" and "rollout_log_probs" in t.keys():
        return "rollout_log_probs"
    wanted = "rollout_log_probs" if old_policy == "rollout" else "old_log_probs"
    raise KeyError(f"pi_old is the {old_policy} log-probs (RunPlan.old_policy={old_policy!r}), but this batch has "
                   f"no {wanted}; set algorithm.old_log_probs=recompute")


def rollout_correction(old: torch.Tensor, t, mask: torch.Tensor, off_policy) -> tuple[torch.Tensor | None, dict]:
    """The weights ``[batch, response_len]`` of the correction ``off_policy`` (``algorithm.off_policy``) names
    (None when it is ``none`` or the batch has no rollout log-probs) and its token-mean metrics."""
    if "rollout_log_probs" not in t.keys():
        return None, {}
    inp = OffPolicyInput(old, t["rollout_log_probs"].to(mask.device), mask, off_policy.level, off_policy.cap,
                         off_policy.low, off_policy.high)
    correction = OFF_POLICY_CORRECTIONS.get(off_policy.correction)(inp)
    return correction.weights, correction.metrics


def critic_loss(
    fwd: ForwardOutput,
    micro: Batch,
    algo: DictConfig,
    cliprange_value: float,
    denominators: LossDenominators,
    loss_scale_factor: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    t = micro.tensors
    mask = t["response_mask"].to(fwd.values.device)
    per_token, value_metrics = value_loss(
        fwd.values, t["values"].to(mask.device), t["returns"].to(mask.device), mask, cliprange_value
    )
    loss = aggregate_loss(per_token, mask, algo.loss_agg_mode, denominators, loss_scale_factor)
    metrics = {f"critic/{k}": v for k, v in _weighted(value_metrics, mask, denominators).items()}
    metrics["critic/vf_loss"] = float(loss.detach())
    return loss, metrics


def sft_loss(fwd: ForwardOutput, micro: Batch, denominators: LossDenominators) -> tuple[torch.Tensor, dict[str, float]]:
    mask = micro.tensors["response_mask"].to(fwd.log_probs.device)
    loss = aggregate_loss(-fwd.log_probs, mask, "token-mean", denominators)
    metrics = {"sft/nll": float(loss.detach())}
    return _with_router_loss(loss, metrics, fwd, mask, denominators)
