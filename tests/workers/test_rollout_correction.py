"""Truncated importance sampling against the rollout engine's log-probs in the actor's loss, hand-computed (the
alias algorithm.tis_cap as the config resolves it); pi_old taken from the rollout."""

import math

import pytest
import torch
from omegaconf import OmegaConf

from rlplat.algorithms import LossDenominators
from rlplat.config import load_config
from rlplat.config.schema import AlgorithmConfig, OffPolicyConfig
from rlplat.protocol import Batch
from rlplat.workers.actor_loss import actor_loss, rollout_correction
from rlplat.engines.base import ForwardOutput


def test_weights_and_mismatch_metrics_by_hand():
    old = torch.zeros(1, 4)
    t = Batch.from_dict({"rollout_log_probs": torch.tensor([[-0.5, 0.5, -2.0, 3.0]])}).tensors
    mask = torch.tensor([[1, 1, 1, 0]])  # the last token is padding: ignored everywhere
    weights, metrics = rollout_correction(old, t, mask, load_config(["algorithm.tis_cap=2.0"]).algorithm.off_policy)
    torch.testing.assert_close(weights[0, :3], torch.tensor([math.exp(0.5), math.exp(-0.5), 2.0]))
    assert math.isclose(float(metrics["rollout/log_prob_abs_diff"]), (0.5 + 0.5 + 2.0) / 3, rel_tol=1e-6)
    assert math.isclose(float(metrics["off_policy/ratio_high_frac"]), 1 / 3, rel_tol=1e-6)
    off, off_metrics = rollout_correction(old, t, mask, load_config([]).algorithm.off_policy)
    assert off is None and set(off_metrics) == {"rollout/log_prob_abs_diff", "rollout/mismatch_kl", "rollout/mismatch_k3"}


def test_policy_loss_is_weighted_token_by_token():
    algo = OmegaConf.structured(AlgorithmConfig(off_policy=OffPolicyConfig(correction="tis", cap=2.0)))
    log_probs = torch.zeros(1, 3, requires_grad=True)
    micro = Batch.from_dict({
        "response_mask": torch.ones(1, 3, dtype=torch.long),
        "advantages": torch.tensor([[1.0, 1.0, 1.0]]),
        "rollout_log_probs": torch.tensor([[-0.5, 0.5, -2.0]]),
    })
    denominators = LossDenominators.from_mask(micro.tensors["response_mask"])
    loss, metrics = actor_loss(ForwardOutput(log_probs=log_probs), micro, algo, denominators, 8.0)
    # on-policy ratio 1, so the PPO loss is -A = -1 per token; token-mean of -w
    expected = -(math.exp(0.5) + math.exp(-0.5) + 2.0) / 3
    assert math.isclose(float(loss), expected, rel_tol=1e-6)
    assert math.isclose(metrics["off_policy/ratio_high_frac"], 1 / 3, rel_tol=1e-6)


def test_pi_old_from_the_rollout_is_the_same_loss_as_recomputed_old_log_probs():
    """RunPlan.old_policy == "rollout": the PPO ratio is taken against the rollout's log-probs, exactly as
    if they had been sent as old_log_probs, and there is no mismatch to report."""
    algo = OmegaConf.structured(AlgorithmConfig())
    rollout = torch.tensor([[-1.0, -0.2, -3.0]])
    fields = {"response_mask": torch.ones(1, 3, dtype=torch.long), "advantages": torch.tensor([[1.0, -1.0, 2.0]]),
              "rollout_log_probs": rollout}
    denominators = LossDenominators.from_mask(fields["response_mask"])
    log_probs = torch.tensor([[-0.9, -0.5, -2.0]], requires_grad=True)
    loss, metrics = actor_loss(ForwardOutput(log_probs=log_probs), Batch.from_dict(fields), algo, denominators, 8.0,
                               old_policy="rollout")
    (grad,) = torch.autograd.grad(loss, log_probs)
    sent = Batch.from_dict({**fields, "old_log_probs": rollout.clone()})
    expected, expected_metrics = actor_loss(ForwardOutput(log_probs=log_probs), sent, algo, denominators, 8.0)
    (expected_grad,) = torch.autograd.grad(expected, log_probs)
    assert float(loss) == float(expected) and torch.equal(grad, expected_grad)
    assert float(loss) != float(actor_loss(ForwardOutput(log_probs=log_probs), Batch.from_dict(fields), algo,
                                           denominators, 8.0)[0])  # "update": this forward's own log-probs
    assert "rollout/log_prob_abs_diff" not in metrics and expected_metrics["rollout/log_prob_abs_diff"] == 0
    del fields["rollout_log_probs"]
    with pytest.raises(KeyError, match="no rollout_log_probs; set algorithm.old_log_probs=recompute"):
        actor_loss(ForwardOutput(log_probs=log_probs), Batch.from_dict(fields), algo, denominators, 8.0,
                   old_policy="rollout")
