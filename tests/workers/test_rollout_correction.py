"""Truncated importance sampling against the rollout engine's log-probs, hand-computed."""

import math

import torch
from omegaconf import OmegaConf

from rlplat.algorithms import LossDenominators
from rlplat.config.schema import AlgorithmConfig
from rlplat.protocol import Batch
from rlplat.workers.actor_loss import actor_loss, rollout_correction
from rlplat.engines.base import ForwardOutput


def test_weights_and_mismatch_metrics_by_hand():
    old = torch.zeros(1, 4)
    t = Batch.from_dict({"rollout_log_probs": torch.tensor([[-0.5, 0.5, -2.0, 3.0]])}).tensors
    mask = torch.tensor([[1, 1, 1, 0]])  # the last token is padding: ignored everywhere
    weights, metrics = rollout_correction(old, t, mask, tis_cap=2.0)
    torch.testing.assert_close(weights[0, :3], torch.tensor([math.exp(0.5), math.exp(-0.5), 2.0]))
    assert math.isclose(float(metrics["rollout/log_prob_abs_diff"]), (0.5 + 0.5 + 2.0) / 3, rel_tol=1e-6)
    assert math.isclose(float(metrics["rollout/tis_capped_frac"]), 1 / 3, rel_tol=1e-6)
    off, off_metrics = rollout_correction(old, t, mask, tis_cap=None)
    assert off is None and set(off_metrics) == {"rollout/log_prob_abs_diff"}


def test_policy_loss_is_weighted_token_by_token():
    algo = OmegaConf.structured(AlgorithmConfig(tis_cap=2.0))
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
    assert math.isclose(metrics["rollout/tis_capped_frac"], 1 / 3, rel_tol=1e-6)
