"""dppo_tv, dppo_kl, dro, reinforce and PF-PPO reweighting against hand-computed values."""

import math

import pytest
import torch

from rlplat.algorithms import pf_ppo_resample, pf_ppo_weights
from rlplat.algorithms.policy_losses import PolicyLossConfig, PolicyLossInput, get_policy_loss

F64 = torch.float64


def run(name, probs, old_probs, adv, **cfg):
    """Per-token loss, d(Σ loss)/d logp and metrics for one row given token probabilities."""
    logp = torch.tensor([probs], dtype=F64).log().requires_grad_(True)
    old = torch.tensor([old_probs], dtype=F64).log()
    inp = PolicyLossInput(logp, old, torch.tensor([adv], dtype=F64), torch.ones_like(old),
                          config=PolicyLossConfig(**cfg))
    out = get_policy_loss(name)(inp)
    out.loss.sum().backward()
    return out.loss[0].tolist(), logp.grad[0].tolist(), {k: float(v) for k, v in out.metrics.items()}


DPPO = dict(clip_ratio_low=0.15, clip_ratio_high=0.15, clip_ratio_c=20.0)


def test_dppo_tv_masks_by_probability_change_and_truncates_the_weight():
    # p_old = 0.5 except the last token (0.01):
    #  t0 A=+1, p 0.7: moved +0.2 > 0.15 -> outside: loss 0, grad 0
    #  t1 A=+1, p 0.6: inside: loss −1·(0.6/0.5)·log 0.6, grad −1.2
    #  t2 A=−1, p 0.3: moved −0.2 < −0.15 -> outside
    #  t3 A=−1, p 0.4: inside: loss +0.8·log 0.4, grad 0.8
    #  t4 A=−1, p 0.5 from 0.01: moved up, inside for A < 0; ratio 50 truncated to c = 20: loss 20·log 0.5
    loss, grad, m = run("dppo_tv", [0.7, 0.6, 0.3, 0.4, 0.5], [0.5, 0.5, 0.5, 0.5, 0.01], [1, 1, -1, -1, -1], **DPPO)
    assert loss == pytest.approx([0, -1.2 * math.log(0.6), 0, 0.8 * math.log(0.4), 20 * math.log(0.5)])
    assert grad == pytest.approx([0, -1.2, 0, 0.8, 20])
    assert (m["clip_frac_upper"], m["clip_frac_lower"], m["truncated_frac"]) == pytest.approx((0.2, 0.2, 0.2))


def binary_kl(p_old, p):
    return p_old * math.log(p_old / p) + (1 - p_old) * math.log((1 - p_old + 1e-8) / (1 - p + 1e-8))


def test_dppo_kl_masks_by_binary_kl_in_the_pushed_direction():
    # δ = 0.05. t0 A=+1, p 0.5 -> 0.7: D = 0.0872 > δ and p rose -> outside.
    # t1 A=+1, 0.5 -> 0.55: D = 0.0050 <= δ -> inside, grad −1.1.
    # t2 A=+1, 0.5 -> 0.2: D = 0.223 > δ but p fell (A > 0 would raise it) -> inside, grad −0.4.
    # t3 A=−1, 0.5 -> 0.2: D > δ and p fell -> outside.
    assert binary_kl(0.5, 0.7) > 0.05 > binary_kl(0.5, 0.55) and binary_kl(0.5, 0.2) > 0.05
    cfg = dict(clip_ratio_low=0.05, clip_ratio_high=0.05, clip_ratio_c=20.0)
    loss, grad, m = run("dppo_kl", [0.7, 0.55, 0.2, 0.2], [0.5] * 4, [1, 1, 1, -1], **cfg)
    assert loss == pytest.approx([0, -1.1 * math.log(0.55), -0.4 * math.log(0.2), 0])
    assert grad == pytest.approx([0, -1.1, -0.4, 0])
    assert (m["clip_frac_upper"], m["clip_frac_lower"]) == (0.25, 0.25)


def test_dro_value_and_gradient():
    # A = 2, logp = −1, old = −1.5, β = 0.1: L = −(2·(−1) − 0.05·0.25) = 2.0125;
    # dL/dlogp = −(A − β(logp − old)) = −(2 − 0.05) = −1.95
    logp = torch.tensor([[-1.0]], dtype=F64, requires_grad=True)
    inp = PolicyLossInput(logp, torch.tensor([[-1.5]], dtype=F64), torch.tensor([[2.0]], dtype=F64),
                          torch.ones(1, 1), config=PolicyLossConfig(dro_beta=0.1))
    out = get_policy_loss("dro")(inp)
    out.loss.sum().backward()
    assert out.loss.item() == pytest.approx(2.0125) and logp.grad.item() == pytest.approx(-1.95)
    with pytest.raises(ValueError, match="dro_beta must be > 0"):
        PolicyLossConfig(dro_beta=0.0)


def test_reinforce_has_no_ratio_and_no_clip():
    # far off-policy (ratio 4) and still L = −A·logp, grad −A; masked token 0
    logp = torch.tensor([[math.log(0.8), math.log(0.1)]], dtype=F64, requires_grad=True)
    inp = PolicyLossInput(logp, torch.log(torch.tensor([[0.2, 0.1]], dtype=F64)),
                          torch.tensor([[1.5, 3.0]], dtype=F64), torch.tensor([[1, 0]]))
    out = get_policy_loss("reinforce")(inp)
    out.loss.sum().backward()
    assert out.loss[0].tolist() == pytest.approx([-1.5 * math.log(0.8), 0])
    assert logp.grad[0].tolist() == pytest.approx([-1.5, 0])
    assert float(out.metrics["ratio_mean"]) == pytest.approx(4.0)


# ---------------------------------------------------------------------------- PF-PPO
SCORES = torch.tensor([1.0, -2.0, 0.0, 0.5])


@pytest.mark.parametrize("method, expected", [
    ("pow", [1, 4, 0, 0.25]),  # |s|^2
    ("max_min", [1, 1, 0, 0]),  # the batch's best (1) and worst (−2)
    ("max_random", [0.4, 0.1, 0.1, 0.1]),
])
def test_pf_ppo_weights(method, expected):
    assert pf_ppo_weights(SCORES, method, 2.0).tolist() == pytest.approx(expected)


def test_pf_ppo_resample_follows_the_weights():
    gen = torch.Generator().manual_seed(0)
    idx = pf_ppo_resample(SCORES, "max_min", 2.0, gen)
    assert idx.shape == (4,) and set(idx.tolist()) <= {0, 1}
    # pow: P = [1, 4, 0, 0.25] / 5.25; over 40k draws each frequency is within 0.01 (> 5 sigma)
    draws = torch.cat([pf_ppo_resample(SCORES, "pow", 2.0, gen) for _ in range(10_000)])
    freq = torch.bincount(draws, minlength=4).double() / draws.numel()
    assert freq.tolist() == pytest.approx([1 / 5.25, 4 / 5.25, 0, 0.25 / 5.25], abs=0.01)
    # all-zero weights fall back to uniform (the 1e-8 floor) instead of failing
    assert pf_ppo_resample(torch.zeros(3), "pow", 2.0, gen).shape == (3,)
    with pytest.raises(ValueError, match="not one of"):
        pf_ppo_resample(SCORES, "best", 2.0)
