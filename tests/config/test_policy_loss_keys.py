"""The policy-loss knobs (algorithm.policy_loss_options: clip_cov / kl_cov / sapo) reach the loss and change it."""

import dataclasses

import pytest
import torch

from rlplat.algorithms import PolicyLossConfig, PolicyLossInput, get_policy_loss
from rlplat.config import ConfigError
from rlplat.trainer.run import load_run_config
from rlplat.workers.actor_loss import policy_loss_config


def loss_under(*overrides: str) -> torch.Tensor:
    cfg, _ = load_run_config(list(overrides))
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(8, 6, generator=gen) * 0.1 - 1.0
    old = logp + torch.randn(8, 6, generator=gen) * 0.3
    inp = PolicyLossInput(log_prob=logp, old_log_prob=old, advantages=torch.randn(8, 6, generator=gen),
                          response_mask=torch.ones(8, 6), config=policy_loss_config(cfg.algorithm),
                          generator=torch.Generator().manual_seed(1))
    return get_policy_loss(cfg.algorithm.policy_loss)(inp).loss


def test_every_policy_loss_field_has_a_key():
    cfg, _ = load_run_config([])
    assert dataclasses.asdict(policy_loss_config(cfg.algorithm)) == dataclasses.asdict(PolicyLossConfig(
        clip_ratio_low=0.2, clip_ratio_high=0.2))  # grpo preset: defaults everywhere else


# The coefficient and bounds only matter once some tokens are selected: those rows raise the share first.
@pytest.mark.parametrize("loss, key, value, base", [
    ("sapo", "sapo_tau_pos", 4.0, ()), ("sapo", "sapo_tau_neg", 4.0, ()), ("kl_cov", "kl_cov_ratio", 1.0, ()),
    ("kl_cov", "kl_cov_coef", 5.0, ("algorithm.policy_loss_options.kl_cov_ratio=0.5",)), 
    ("clip_cov", "clip_cov_ratio", 1.0, ("algorithm.policy_loss_options.clip_cov_lb=-100", "algorithm.policy_loss_options.clip_cov_ub=100")),
    ("clip_cov", "clip_cov_lb", -100.0, ("algorithm.policy_loss_options.clip_cov_ratio=0.5", "algorithm.policy_loss_options.clip_cov_ub=100")),
])
def test_knob_changes_the_loss(loss, key, value, base):
    base_loss = loss_under(f"algorithm.policy_loss={loss}", *base)
    changed = loss_under(f"algorithm.policy_loss={loss}", *base, f"algorithm.policy_loss_options.{key}={value}")
    assert not torch.allclose(base_loss, changed)


def test_bad_knob_names_the_key():
    with pytest.raises(ConfigError, match=r"^algorithm\.policy_loss_options\.sapo_tau_pos/neg must be > 0"):
        load_run_config(["algorithm.policy_loss_options.sapo_tau_neg=0"])
