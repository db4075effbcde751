"""Policy losses, value loss and entropy against values derived by hand (arithmetic in the comments)
and against second, loop-based formulations of the sequence-level losses."""

import math
import statistics

import pytest
import torch

from rlplat.algorithms.policy_losses import (
    POLICY_LOSSES,
    PolicyLossConfig,
    PolicyLossInput,
    entropy_from_logits,
    get_policy_loss,
    value_loss,
)
from rlplat.registry import UnknownNameError

F64 = torch.float64
COMMON_METRICS = {"clip_frac_upper", "clip_frac_lower", "approx_kl", "ratio_mean", "ratio_var"}


def make(ratios, advantages, mask=None, old=-1.0, **cfg):
    """One row with chosen ratios: old log-prob `old`, logp = old + log(ratio) (requires grad)."""
    ratios = torch.tensor([ratios], dtype=F64)
    old_lp = torch.full_like(ratios, old)
    logp = (old_lp + ratios.log()).requires_grad_(True)
    adv = torch.tensor([advantages], dtype=F64)
    mask = torch.ones_like(ratios) if mask is None else torch.tensor([mask], dtype=F64)
    return PolicyLossInput(logp, old_lp, adv, mask, config=PolicyLossConfig(**cfg))


def run(name, inp):
    """Loss output, d(sum of per-token losses)/d logp, and the metrics as floats."""
    out = get_policy_loss(name)(inp)
    out.loss.sum().backward()
    return out, inp.log_prob.grad, {k: float(v) for k, v in out.metrics.items()}


def approx(values):
    return pytest.approx(values, rel=1e-9, abs=1e-12)


# ---------------------------------------------------------------------------- ppo
def test_ppo_every_branch_metrics_and_masking_by_hand():
    # eps_low 0.2 (bounds [0.8, 1.3]), eps_high 0.3, c 3; loss = max(-A r, -A clip(r)), A<0: min(., -A c)
    # t0: r=1.1,  A=+1: unclipped -1.1                      grad d/dlogp = -A r = -1.1
    # t1: r=1.5,  A=+1: -clip = -1.3 > -1.5 -> -1.3          grad 0, upper clip
    # t2: r=0.5,  A=-1: max(0.5, 0.8) = 0.8                  grad 0, lower clip
    # t3: r=5.0,  A=-1: max(5, 1.3) = 5 > c|A| = 3 -> 3      grad 0, dual clip
    # t4: r=2.0,  A=-1: max(2, 1.3) = 2 < 3                  grad -A r = 2
    # t5: r=1.25, A=+1: 1.25 < 1.3 (eps_high 0.3) -> -1.25   grad -1.25 (eps 0.2 would have clipped it)
    # t6: r=0.75, A=-1: max(0.75, 0.8) = 0.8                 grad 0, lower clip (eps_low stays 0.2)
    # t7: masked (would be an upper clip): loss 0, grad 0, not counted anywhere
    ratios = [1.1, 1.5, 0.5, 5.0, 2.0, 1.25, 0.75, 7.0]
    inp = make(ratios, [1, 1, -1, -1, -1, 1, -1, 1], mask=[1, 1, 1, 1, 1, 1, 1, 0],
               clip_ratio_low=0.2, clip_ratio_high=0.3)
    out, grad, m = run("ppo", inp)
    assert out.loss[0].tolist() == approx([-1.1, -1.3, 0.8, 3.0, 2.0, -1.25, 0.8, 0.0])
    assert grad[0].tolist() == approx([-1.1, 0, 0, 0, 2.0, -1.25, 0, 0])
    valid = ratios[:7]
    assert m["clip_frac_upper"] == approx(1 / 7)  # t1
    assert m["clip_frac_lower"] == approx(2 / 7)  # t2, t6
    assert m["dual_clip_frac"] == approx(1 / 7)  # t3
    assert m["ratio_mean"] == approx(sum(valid) / 7)  # 12.1 / 7
    assert m["ratio_var"] == approx(statistics.variance(valid))
    assert m["approx_kl"] == approx(-sum(math.log(r) for r in valid) / 7)  # mean(old - logp) = -mean(log r)


@pytest.mark.parametrize(
    "low, high, expected",
    [
        # r = 1.25 with A = +1, r = 0.75 with A = -1
        (0.2, 0.2, [-1.2, 0.8]),  # symmetric: both clipped (bounds 0.8, 1.2)
        (0.2, 0.28, [-1.25, 0.8]),  # clip-higher frees the A>0 token only
        (0.3, 0.2, [-1.2, 0.75]),  # a wider lower bound frees the A<0 token only
    ],
)
def test_ppo_decoupled_bounds(low, high, expected):
    out, _, _ = run("ppo", make([1.25, 0.75], [1, -1], clip_ratio_low=low, clip_ratio_high=high))
    assert out.loss[0].tolist() == approx(expected)


def test_ppo_dual_clip_constant_is_a_parameter():
    # r = 5, A = -2: max(10, 2*1.2) = 10; c = 3 -> 6; c = 10 -> 10 (not reached, no dual clip)
    out3, grad3, m3 = run("ppo", make([5.0], [-2.0], clip_ratio_c=3.0))
    out10, grad10, m10 = run("ppo", make([5.0], [-2.0], clip_ratio_c=10.0))
    assert (out3.loss.item(), out10.loss.item()) == approx((6.0, 10.0))
    assert (grad3.item(), grad10.item()) == approx((0.0, 10.0))  # -A r = 10 when not clipped
    assert (m3["dual_clip_frac"], m10["dual_clip_frac"]) == (1.0, 0.0)


# ---------------------------------------------------------------------------- gspo
def gspo_input(low, high):
    # seq 0: log ratios [0.2, 0.0, masked 5.0], A = +1 -> s0 = exp(mean(0.2, 0.0)) = exp(0.1)
    # seq 1: log ratios [-0.4, -0.2, 0.0],      A = -2 -> s1 = exp(-0.2)
    delta = torch.tensor([[0.2, 0.0, 5.0], [-0.4, -0.2, 0.0]], dtype=F64)
    old = torch.full((2, 3), -1.0, dtype=F64)
    adv = torch.tensor([[1.0] * 3, [-2.0] * 3], dtype=F64)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]], dtype=torch.bool)
    return PolicyLossInput((old + delta).requires_grad_(True), old, adv, mask,
                           config=PolicyLossConfig(clip_ratio_low=low, clip_ratio_high=high))


def test_gspo_value_is_sequence_ratio_and_token_grad_is_s_times_dlogp():
    s0, s1 = math.exp(0.1), math.exp(-0.2)
    # eps 0.5: s0 = 1.105 and s1 = 0.819 lie inside [0.5, 1.5] -> L = -A s_i, dL/dlogp_t = -A s_i
    out, grad, m = run("gspo", gspo_input(0.5, 0.5))
    assert out.loss.tolist() == [approx([-s0, -s0, 0.0]), approx([2 * s1] * 3)]
    assert grad.tolist() == [approx([-s0, -s0, 0.0]), approx([2 * s1] * 3)]
    assert (m["clip_frac_upper"], m["clip_frac_lower"]) == (0.0, 0.0)
    assert m["ratio_mean"] == approx((2 * s0 + 3 * s1) / 5)  # the sequence ratio on each valid token
    assert m["approx_kl"] == approx(-(0.2 + 0.0 - 0.4 - 0.2 + 0.0) / 5)


def test_gspo_tiny_clip_range_clips_whole_sequences():
    # eps 3e-4 / 4e-4: s0 = 1.105 > 1.0004 with A > 0 -> L = -1.0004, upper clip, no gradient
    #                  s1 = 0.819 < 0.9997 with A < 0 -> L = 2 * 0.9997, lower clip, no gradient
    out, grad, m = run("gspo", gspo_input(3e-4, 4e-4))
    assert out.loss.tolist() == [approx([-1.0004, -1.0004, 0.0]), approx([2 * 0.9997] * 3)]
    assert grad.abs().sum().item() == 0.0
    assert (m["clip_frac_upper"], m["clip_frac_lower"]) == approx((2 / 5, 3 / 5))


def test_gspo_seq_mean_token_mean_gradient_equals_sequence_objective_loop():
    # GSPO's objective, written per sequence: J = mean_i A_i * exp(mean_t (logp - old)), unclipped
    gen = torch.Generator().manual_seed(5)
    old = torch.randn(4, 6, dtype=F64, generator=gen)
    delta = 0.05 * torch.randn(4, 6, dtype=F64, generator=gen)
    adv = torch.randn(4, 1, dtype=F64, generator=gen).expand(4, 6)
    mask = torch.tensor([[1] * 6, [1] * 3 + [0] * 3, [1] * 5 + [0], [1] + [0] * 5], dtype=F64)
    logp = (old + delta).requires_grad_(True)
    cfg = PolicyLossConfig(clip_ratio_low=0.5, clip_ratio_high=0.5)  # wide: s_i ~ 1 +- 0.05 stays unclipped
    out = get_policy_loss("gspo")(PolicyLossInput(logp, old, adv, mask, config=cfg))
    ((out.loss * mask).sum(-1) / mask.sum(-1)).mean().backward()  # seq-mean-token-mean

    logp_ref = (old + delta).requires_grad_(True)
    terms = []
    for i in range(4):
        n = int(mask[i].sum())
        seq_log_ratio = sum(logp_ref[i, t] - old[i, t] for t in range(n)) / n
        terms.append(-adv[i, 0] * torch.exp(seq_log_ratio))
    (sum(terms) / 4).backward()
    torch.testing.assert_close(logp.grad, logp_ref.grad)


# ---------------------------------------------------------------------------- cispo, gpg
def test_cispo_weight_is_clipped_constant_and_every_token_keeps_a_gradient():
    # eps_low 0.2, eps_high 0.28; L = -sg(clip(r, 0.8, 1.28)) * A * logp, grad = -clip(r) * A
    # t0: r=1.5, A=2  -> weight 1.28 (upper) -> grad -2.56
    # t1: r=0.5, A=1  -> weight 0.8 (lower)  -> grad -0.8
    # t2: r=1.0, A=-3 -> weight 1            -> grad 3
    # t3: masked
    inp = make([1.5, 0.5, 1.0, 3.0], [2.0, 1.0, -3.0, 1.0], mask=[1, 1, 1, 0],
               clip_ratio_low=0.2, clip_ratio_high=0.28)
    logp = inp.log_prob.detach()[0].tolist()
    out, grad, m = run("cispo", inp)
    assert out.loss[0].tolist() == approx([-1.28 * 2 * logp[0], -0.8 * logp[1], 3 * logp[2], 0.0])
    assert grad[0].tolist() == approx([-2.56, -0.8, 3.0, 0.0])
    assert (m["clip_frac_upper"], m["clip_frac_lower"]) == approx((1 / 3, 1 / 3))


def test_gpg_is_plain_policy_gradient():
    # L = -A logp, grad = -A; no clipping, so clip fractions are 0 even at r = 3
    inp = make([1.3, 0.7, 3.0, 2.0], [0.5, -2.0, 1.0, 4.0], mask=[1, 1, 1, 0])
    logp = inp.log_prob.detach()[0].tolist()
    out, grad, m = run("gpg", inp)
    assert out.loss[0].tolist() == approx([-0.5 * logp[0], 2.0 * logp[1], -logp[2], 0.0])
    assert grad[0].tolist() == approx([-0.5, 2.0, -1.0, 0.0])
    assert (m["clip_frac_upper"], m["clip_frac_lower"]) == (0.0, 0.0)
    assert m["ratio_mean"] == approx((1.3 + 0.7 + 3.0) / 3)


# ---------------------------------------------------------------------------- clip_cov
@pytest.mark.parametrize("clip_cov_ratio", [0.5, 2e-4])
def test_clip_cov_by_hand_stops_gradient_on_the_only_candidate(clip_cov_ratio):
    # valid tokens: A = [2, -2, 1, -1] (mean 0); logp = [-0.5, -2.5, -1, -1] (mean -1.25)
    # cov = A * (logp + 1.25) = [2*0.75, -2*-1.25, 1*0.25, -1*0.25] = [1.5, 2.5, 0.25, -0.25]
    # ratios [1.1, 0.5, 1, 1]: t1 (A<0, r=0.5 < 0.8) is already clipped -> not a candidate
    # candidates (1 < cov < 5, unclipped): t0 only. count = max(1, int(0.5 * 4)) = 2 -> fewer: just t0;
    #   with the default ratio 2e-4, count = max(1, int(0.0008)) = 1 -> t0
    # t4 is masked; unmasked (A=2, logp=0 -> cov 2.5) it would be a second candidate
    logp = torch.tensor([[-0.5, -2.5, -1.0, -1.0, 0.0]], dtype=F64, requires_grad=True)
    ratios = torch.tensor([[1.1, 0.5, 1.0, 1.0, 1.0]], dtype=F64)
    old = logp.detach() - ratios.log()
    adv = torch.tensor([[2.0, -2.0, 1.0, -1.0, 2.0]], dtype=F64)
    cfg = PolicyLossConfig(clip_cov_ratio=clip_cov_ratio, clip_cov_lb=1.0, clip_cov_ub=5.0)
    inp = PolicyLossInput(logp, old, adv, torch.tensor([[1, 1, 1, 1, 0]]), config=cfg,
                          generator=torch.Generator().manual_seed(0))
    out, grad, m = run("clip_cov", inp)
    # t0 stopped: 0; t1 lower clip: -A*0.8 = 1.6 (grad 0); t2: -1*1 (grad -A r = -1); t3: 1 (grad 1)
    assert out.loss[0].tolist() == approx([0.0, 1.6, -1.0, 1.0, 0.0])
    assert grad[0].tolist() == approx([0.0, 0.0, -1.0, 1.0, 0.0])
    assert (m["clip_cov_frac"], m["clip_frac_lower"], m["clip_frac_upper"]) == approx((1 / 4, 1 / 4, 0.0))


def clip_cov_on_random_batch(seed):
    data = torch.Generator().manual_seed(0)
    old = torch.randn(4, 16, dtype=F64, generator=data)
    delta = 0.05 * torch.randn(4, 16, dtype=F64, generator=data)
    adv = 3 * torch.randn(4, 16, dtype=F64, generator=data)
    cfg = PolicyLossConfig(clip_cov_ratio=0.1, clip_cov_lb=-100, clip_cov_ub=100)  # every token qualifies
    inp = PolicyLossInput((old + delta).requires_grad_(True), old, adv, torch.ones(4, 16), config=cfg,
                          generator=torch.Generator().manual_seed(seed))
    out, grad, m = run("clip_cov", inp)
    ratio = delta.exp()
    plain = torch.maximum(-adv * ratio, -adv * ratio.clamp(0.8, 1.2))  # the surrogate without selection
    return out, grad, m, plain


def test_clip_cov_selection_is_random_but_reproducible_with_a_seeded_generator():
    out_a, grad_a, m_a, plain = clip_cov_on_random_batch(seed=1)
    out_b, grad_b, _, _ = clip_cov_on_random_batch(seed=1)
    stopped = (grad_a == 0) & (out_a.loss == 0)
    assert int(stopped.sum()) == 6  # int(0.1 * 64); r is within 1 ± 0.2 here, so no token is clipped
    assert m_a["clip_cov_frac"] == approx(6 / 64)
    assert torch.equal(grad_a, grad_b) and torch.equal(out_a.loss, out_b.loss)
    torch.testing.assert_close(out_a.loss[~stopped], plain[~stopped])
    selections = {tuple(clip_cov_on_random_batch(seed)[1].eq(0).flatten().tolist()) for seed in range(2, 7)}
    assert len(selections) > 1  # the generator really drives the choice


# ---------------------------------------------------------------------------- kl_cov
def kl_cov_input(ratio):
    # valid: A = [2, -2, 0.1, 0.1] (mean 0.05), logp = [-0.5, -1.5, -0.9, -1.1] (mean -1), old = -1
    # cov = [1.95*0.5, -2.05*-0.5, 0.05*0.1, 0.05*-0.1] = [0.975, 1.025, 0.005, -0.005]
    old = torch.tensor([[-1.0] * 5], dtype=F64)
    logp = torch.tensor([[-0.5, -1.5, -0.9, -1.1, 3.0]], dtype=F64, requires_grad=True)
    adv = torch.tensor([[2.0, -2.0, 0.1, 0.1, 9.0]], dtype=F64)  # t4 masked (its cov would be the top)
    return PolicyLossInput(logp, old, adv, torch.tensor([[1, 1, 1, 1, 0]]),
                           config=PolicyLossConfig(kl_cov_ratio=ratio, kl_cov_coef=1.0))


@pytest.mark.parametrize(
    "ratio, penalised",
    [(0.5, [0, 1]),  # k = int(0.5 * 4) = 2: tokens 1 (1.025) and 0 (0.975)
     (0.25, [1]),  # k = 1: only the largest covariance, token 1
     (0.2, [1]),  # int(0.8) = 0, floored to 1: a call with < 1/ratio tokens still penalises its top token
     (0.0, [])],  # ratio 0: plain -A r
)
def test_kl_cov_penalises_top_covariance_tokens(ratio, penalised):
    # base L = -A r with r = exp(logp - old) = [e^0.5, e^-0.5, e^0.1, e^-0.1]; |logp - old| = [.5, .5, .1, .1]
    # penalised tokens add |delta|; its gradient adds sign(delta): +1 for t0, -1 for t1
    out, grad, m = run("kl_cov", kl_cov_input(ratio))
    r = [math.exp(d) for d in (0.5, -0.5, 0.1, -0.1)]
    adv, abs_delta, sign = [2.0, -2.0, 0.1, 0.1], [0.5, 0.5, 0.1, 0.1], [1, -1, 1, -1]
    loss = [-a * ri + (d if t in penalised else 0) for t, (a, ri, d) in enumerate(zip(adv, r, abs_delta))]
    dlogp = [-a * ri + (s if t in penalised else 0) for t, (a, ri, s) in enumerate(zip(adv, r, sign))]
    assert out.loss[0].tolist() == approx(loss + [0.0])
    assert grad[0].tolist() == approx(dlogp + [0.0])
    assert m["kl_cov_frac"] == len(penalised) / 4 and m["clip_frac_upper"] == m["clip_frac_lower"] == 0


# ---------------------------------------------------------------------------- sapo
def test_sapo_gate_value_and_gradient_for_both_signs():
    # g(r) = sigmoid(tau (r - 1)) * 4 / tau, L = -g A, dL/dlogp = -A g'(r) r with g' = 4 s (1 - s)
    # t0: A=+1, tau_pos=1,    r=1.5: g = 4 s(0.5);             dL/dlogp = -4 s(.5)(1-s(.5)) * 1.5
    # t1: A=-1, tau_neg=1.05, r=0.8: g = s(-0.21) * 4 / 1.05;  dL/dlogp = +4 s(-.21)(1-s(-.21)) * 0.8
    # t2: A=-2, tau_neg,      r=1.0: g = 0.5 * 4 / 1.05 = 2/1.05, L = 4/1.05; dL/dlogp = 2 * 1 * 1 (g'(1)=1)
    inp = make([1.5, 0.8, 1.0, 4.0], [1.0, -1.0, -2.0, 1.0], mask=[1, 1, 1, 0])
    out, grad, m = run("sapo", inp)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    assert out.loss[0].tolist() == approx([-4 * sig(0.5), sig(-0.21) * 4 / 1.05, 4 / 1.05, 0.0])
    d0 = 4 * sig(0.5) * (1 - sig(0.5)) * 1.5
    d1 = 4 * sig(-0.21) * (1 - sig(-0.21)) * 0.8
    assert grad[0].tolist() == approx([-d0, d1, 2.0, 0.0])
    assert (m["clip_frac_upper"], m["clip_frac_lower"]) == (0.0, 0.0)


# ---------------------------------------------------------------------------- geo_mean
def test_geo_mean_two_sequences_by_hand():
    # eps 0.4 in log space. seq 0, A=+1: delta [0.6, 0.0, masked 3.0] -> min(delta, clamp) = [0.4, 0.0]
    #   rho0 = exp(0.2), A_hat = 1 -> L = -exp(0.2) on each valid token
    # seq 1, A=-1: delta [-0.6, 0.2, 0.0] -> -min(-delta, -clamp) = max(delta, clamp) = [-0.4, 0.2, 0.0]
    #   rho1 = exp(-0.2/3), A_hat = -1 -> L = +exp(-0.2/3)
    # gradient of the summed token losses: n_i tokens * (-A_hat rho_i) * (1/n_i) * d delta'_t/d logp_t,
    #   d delta'/d logp = 0 where the bound decides (the two +-0.6 tokens), else 1
    delta = torch.tensor([[0.6, 0.0, 3.0], [-0.6, 0.2, 0.0]], dtype=F64)
    old = torch.full((2, 3), -1.0, dtype=F64)
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3], dtype=F64)
    inp = PolicyLossInput((old + delta).requires_grad_(True), old, adv, torch.tensor([[1, 1, 0], [1, 1, 1]]),
                          config=PolicyLossConfig(clip_ratio_low=0.4, clip_ratio_high=0.4))
    out, grad, m = run("geo_mean", inp)
    rho0, rho1 = math.exp(0.2), math.exp(-0.2 / 3)
    assert out.loss.tolist() == [approx([-rho0, -rho0, 0.0]), approx([rho1] * 3)]
    assert grad.tolist() == [approx([0.0, -rho0, 0.0]), approx([0.0, rho1, rho1])]
    assert (m["clip_frac_upper"], m["clip_frac_lower"]) == approx((1 / 5, 1 / 5))


def test_geo_mean_matches_a_per_sequence_loop():
    gen = torch.Generator().manual_seed(11)
    old = torch.randn(5, 7, dtype=F64, generator=gen)
    delta = 0.5 * torch.randn(5, 7, dtype=F64, generator=gen)
    adv = torch.randn(5, 1, dtype=F64, generator=gen).expand(5, 7)
    lengths = [7, 1, 4, 6, 2]
    mask = torch.tensor([[1] * n + [0] * (7 - n) for n in lengths])
    low, high = 0.3, 0.4
    cfg = PolicyLossConfig(clip_ratio_low=low, clip_ratio_high=high)
    out = get_policy_loss("geo_mean")(PolicyLossInput(old + delta, old, adv, mask, config=cfg))
    for i, n in enumerate(lengths):
        a = adv[i, 0].item()
        clipped = [min(max(d, -low), high) for d in delta[i, :n].tolist()]
        kept = [min(d, c) if a > 0 else max(d, c) for d, c in zip(delta[i, :n].tolist(), clipped)]
        expected = -a * math.exp(sum(kept) / n)
        assert out.loss[i, :n].tolist() == approx([expected] * n) and out.loss[i, n:].abs().sum() == 0


# ---------------------------------------------------------------------------- every loss
def random_input(mask_dtype=F64, seed=3, masked_garbage=0.0, **kwargs):
    gen = torch.Generator().manual_seed(seed)
    old = torch.randn(3, 6, dtype=F64, generator=gen)
    logp = old + 0.3 * torch.randn(3, 6, dtype=F64, generator=gen)
    adv = torch.randn(3, 6, dtype=F64, generator=gen)
    mask = torch.ones(3, 6, dtype=mask_dtype)
    mask[1, 4:] = 0
    mask[2, 1] = 0
    hidden = ~mask.bool()
    logp, adv = logp + masked_garbage * hidden, adv - 3 * masked_garbage * hidden
    cfg = PolicyLossConfig(clip_cov_lb=-10.0, clip_cov_ub=10.0, clip_cov_ratio=0.2, kl_cov_ratio=0.2)
    return PolicyLossInput(logp.requires_grad_(True), old, adv, mask, config=cfg,
                           generator=torch.Generator().manual_seed(0), **kwargs)


EXTRA_METRICS = {"ppo": {"dual_clip_frac"}, "clip_cov": {"clip_cov_frac"}, "kl_cov": {"kl_cov_frac"}}


@pytest.mark.parametrize("mask_dtype", [F64, torch.bool])
@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_every_loss_shape_masking_gradients_and_metrics(name, mask_dtype):
    inp = random_input(mask_dtype)
    out, grad, _ = run(name, inp)
    masked = ~inp.response_mask.bool()
    assert out.loss.shape == (3, 6) and (out.loss[masked] == 0).all()
    assert torch.isfinite(grad).all() and (grad[masked] == 0).all() and (grad[~masked] != 0).any()
    assert COMMON_METRICS | EXTRA_METRICS.get(name, set()) <= set(out.metrics)
    for value in out.metrics.values():
        assert value.dim() == 0 and not value.requires_grad and torch.isfinite(value)


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_masked_token_contents_change_nothing(name):
    # change logp and A on masked tokens only: loss, gradient and metrics must stay exactly the same
    clean_out, clean_grad, clean_m = run(name, random_input())
    dirty_out, dirty_grad, dirty_m = run(name, random_input(masked_garbage=2.5))
    torch.testing.assert_close(dirty_out.loss, clean_out.loss)
    torch.testing.assert_close(dirty_grad, clean_grad)
    assert dirty_m == approx(clean_m)


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_importance_weights_scale_loss_and_gradient(name):
    # the gradient is that of sum_t w_t L_t (for the sequence-coupled geo_mean, L_t depends on every
    # token of its sequence, so it is not simply w_t times the unweighted gradient of token t)
    weights = torch.linspace(0.25, 2.0, 18, dtype=F64).reshape(3, 6).requires_grad_(True)
    plain_inp = random_input()
    plain = get_policy_loss(name)(plain_inp)
    (expected_grad,) = torch.autograd.grad(plain.loss, plain_inp.log_prob, grad_outputs=weights.detach())
    weighted_out, weighted_grad, _ = run(name, random_input(importance_weights=weights))
    torch.testing.assert_close(weighted_out.loss, plain.loss.detach() * weights.detach())
    torch.testing.assert_close(weighted_grad, expected_grad)
    if name != "geo_mean":  # token-local losses: the gradient is scaled token by token
        torch.testing.assert_close(weighted_grad, run(name, random_input())[1] * weights.detach())
    assert weights.grad is None  # constants: no gradient flows into the weights


def test_metrics_of_a_bf16_loss_are_counted_in_float32():
    # 1001 valid tokens, 1 upper-clipped (r=2, A=1). bf16 keeps 8 significant bits: the count 1001 rounds
    # to 1000 and the share to ~3 digits, so only a float32 (or wider) metric meets rel 1e-5
    ratios = torch.ones(1, 1001, dtype=torch.bfloat16)
    ratios[0, 0] = 2.0
    logp = ratios.log().requires_grad_(True)
    inp = PolicyLossInput(logp, torch.zeros_like(ratios), torch.ones_like(ratios), torch.ones(1, 1001))
    out = get_policy_loss("ppo")(inp)
    assert out.loss.dtype == torch.bfloat16 and out.metrics["clip_frac_upper"].dtype == torch.float32
    assert out.metrics["clip_frac_upper"].item() == pytest.approx(1 / 1001, rel=1e-5)


def test_ppo_importance_weights_by_hand():
    # t0: r=1.1, A=+1 -> -1.1 * 2 = -2.2, grad -1.1 * 2; t1: r=0.9, A=-1 -> 0.9 * 0.5 = 0.45, grad 0.45
    inp = make([1.1, 0.9], [1, -1])
    inp.importance_weights = torch.tensor([[2.0, 0.5]], dtype=F64)
    out, grad, _ = run("ppo", inp)
    assert out.loss[0].tolist() == approx([-2.2, 0.45])
    assert grad[0].tolist() == approx([-2.2, 0.45])


def test_names_unknown_name_and_config_validation():
    expected = {"ppo", "gspo", "cispo", "gpg", "clip_cov", "kl_cov", "sapo", "geo_mean", "reinforce", "dppo_tv",
                "dppo_kl", "dro"}
    assert set(POLICY_LOSSES.names()) == expected
    with pytest.raises(UnknownNameError, match="unknown policy loss 'ppoo'; did you mean 'ppo'"):
        get_policy_loss("ppoo")
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        PolicyLossConfig(clip_ratio_c=1.0)
    with pytest.raises(ValueError, match="sapo_tau_pos/neg must be > 0"):
        PolicyLossConfig(sapo_tau_neg=0.0)
    with pytest.raises(ValueError, match="kl_cov_ratio must be in"):
        PolicyLossConfig(kl_cov_ratio=1.5)


# ---------------------------------------------------------------------------- value loss, entropy
def test_value_loss_by_hand():
    # eps_v = 0.5, loss = 0.5 max((V-R)^2, (clip(V, V_old +- 0.5) - R)^2)
    # t0: V=1.0, V_old=0.0, R=2: unclipped 1, clipped V'=0.5 -> 2.25 (larger) -> 1.125, clipped
    # t1: V=1.8, V_old=1.6, R=2: inside the range, both 0.04 -> 0.02, not clipped
    # t2: V=3.0, V_old=0.0, R=0: unclipped 9, clipped V'=0.5 -> 0.25 -> 4.5, not clipped
    # t3: masked
    values = torch.tensor([[1.0, 1.8, 3.0, 5.0]], dtype=F64, requires_grad=True)
    old = torch.tensor([[0.0, 1.6, 0.0, 0.0]], dtype=F64)
    returns = torch.tensor([[2.0, 2.0, 0.0, 0.0]], dtype=F64)
    loss, metrics = value_loss(values, old, returns, torch.tensor([[1, 1, 1, 0]]), 0.5)
    assert loss[0].tolist() == approx([1.125, 0.02, 4.5, 0.0])
    assert float(metrics["vf_clip_frac"]) == approx(1 / 3)
    assert float(metrics["vpred_mean"]) == approx((1.0 + 1.8 + 3.0) / 3)
    loss.sum().backward()
    # d/dV: t0 clipped (V' at its bound) -> 0; t1 V-R = -0.2; t2 V-R = 3; t3 masked -> 0
    assert values.grad[0].tolist() == approx([0.0, -0.2, 3.0, 0.0])


def test_entropy_from_logits():
    gen = torch.Generator().manual_seed(0)
    logits = 5 * torch.randn(2, 4, 7, dtype=F64, generator=gen)
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(entropy_from_logits(logits), -(p * p.log()).sum(-1))  # [2, 4, 7] -> [2, 4]
    assert entropy_from_logits(torch.zeros(2, 10)).tolist() == pytest.approx([math.log(10)] * 2)
    # float32 logits around 1e4: logsumexp and sum p z are both ~1e4 and would cancel to a wrong 4th digit
    assert entropy_from_logits(torch.full((3,), 1e4)).item() == pytest.approx(math.log(3), rel=1e-6)
    big = torch.tensor([1e4, 1e4 - 1.0, 1e4 - 3.0])
    p = torch.softmax(big.double() - 1e4, -1)
    assert entropy_from_logits(big).item() == pytest.approx(-(p * p.log()).sum().item(), rel=1e-6)
    assert entropy_from_logits(torch.tensor([[1e4, 0.0, -1e4]])).item() == pytest.approx(0.0, abs=1e-6)


def test_entropy_gradient_matches_the_explicit_formula():
    gen = torch.Generator().manual_seed(1)
    logits = (3 * torch.randn(3, 5, dtype=F64, generator=gen)).requires_grad_(True)
    reference = logits.detach().clone().requires_grad_(True)
    weights = torch.arange(3, dtype=F64)
    (entropy_from_logits(logits) * weights).sum().backward()
    p = torch.softmax(reference, -1)
    (-(p * p.log()).sum(-1) * weights).sum().backward()
    torch.testing.assert_close(logits.grad, reference.grad)
