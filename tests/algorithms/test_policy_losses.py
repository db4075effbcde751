"""Policy losses, value loss and entropy against values derived by hand."""

import math

import pytest
import torch

from rlplat.algorithms import (
    POLICY_LOSSES,
    PolicyLossConfig,
    PolicyLossInput,
    entropy_from_logits,
    get_policy_loss,
    value_loss,
)
from rlplat.registry import UnknownNameError

F64 = torch.float64


def make(ratios, advantages, mask=None, old=-1.0, **cfg):
    """Inputs with chosen ratios: old log-prob `old`, logp = old + log(ratio); one row."""
    ratios = torch.tensor([ratios], dtype=F64)
    old_lp = torch.full_like(ratios, old)
    logp = (old_lp + ratios.log()).requires_grad_(True)
    adv = torch.tensor([advantages], dtype=F64)
    mask = torch.ones_like(ratios) if mask is None else torch.tensor([mask], dtype=F64)
    return PolicyLossInput(logp, old_lp, adv, mask, config=PolicyLossConfig(**cfg))


def run(name, inp):
    out = get_policy_loss(name)(inp)
    out.loss.sum().backward()
    return out, inp.log_prob.grad[0]


def test_ppo_branches_by_hand():
    # eps_low 0.2, eps_high 0.3, c 3
    # tok0: r=1.1, A=+1 -> unclipped: -1.1            grad d/dlogp = -A r = -1.1
    # tok1: r=1.5, A=+1 -> clipped at 1.3: -1.3      grad 0, upper clip
    # tok2: r=0.5, A=-1 -> max(0.5, 0.8) = 0.8       grad 0, lower clip
    # tok3: r=5.0, A=-1 -> max(5, 1.3)=5 > c*1=3 -> 3 (dual clip)  grad 0
    # tok4: r=2.0, A=-1 -> 2 (< 3, unclipped)        grad -A r = 2
    # tok5: masked
    inp = make([1.1, 1.5, 0.5, 5.0, 2.0, 7.0], [1, 1, -1, -1, -1, 1], mask=[1, 1, 1, 1, 1, 0],
               clip_ratio_low=0.2, clip_ratio_high=0.3)
    out, grad = run("ppo", inp)
    assert out.loss[0].tolist() == pytest.approx([-1.1, -1.3, 0.8, 3.0, 2.0, 0.0])
    assert grad.tolist() == pytest.approx([-1.1, 0, 0, 0, 2.0, 0])
    m = {k: float(v) for k, v in out.metrics.items()}
    assert m["clip_frac_upper"] == pytest.approx(1 / 5) and m["clip_frac_lower"] == pytest.approx(1 / 5)
    assert m["dual_clip_frac"] == pytest.approx(1 / 5)
    assert m["ratio_mean"] == pytest.approx((1.1 + 1.5 + 0.5 + 5 + 2) / 5)
    logs = [math.log(r) for r in (1.1, 1.5, 0.5, 5.0, 2.0)]
    assert m["approx_kl"] == pytest.approx(-sum(logs) / 5)


def test_ppo_importance_weights_scale_loss_and_grad():
    inp = make([1.1, 0.9], [1, -1])
    inp.importance_weights = torch.tensor([[2.0, 0.5]], dtype=F64)
    out, grad = run("ppo", inp)
    assert out.loss[0].tolist() == pytest.approx([-2.2, 0.45])
    assert grad.tolist() == pytest.approx([-2.2, 0.45])


def test_gspo_value_is_sequence_ratio_and_grad_scaled_by_it():
    # log ratios 0.2 and 0.0 -> s = exp(0.1); A = 1 everywhere, wide clip: L_t = -s, dL/dlogp_t = -s
    inp = make([math.exp(0.2), 1.0], [1, 1], clip_ratio_low=0.5, clip_ratio_high=0.5)
    out, grad = run("gspo", inp)
    s = math.exp(0.1)
    assert out.loss[0].tolist() == pytest.approx([-s, -s])
    assert grad.tolist() == pytest.approx([-s, -s])
    # with a tiny clip range the sequence ratio is clipped at 1 + 4e-4: no gradient
    inp = make([math.exp(0.2), 1.0], [1, 1], clip_ratio_low=3e-4, clip_ratio_high=4e-4)
    out, grad = run("gspo", inp)
    assert out.loss[0].tolist() == pytest.approx([-(1 + 4e-4)] * 2)
    assert grad.tolist() == [0.0, 0.0]


def test_cispo_weight_is_clipped_and_stop_gradient():
    # r = 1.5 clipped to 1.28; L = -1.28 * A * logp; grad = -1.28 * A
    inp = make([1.5, 0.5], [2.0, 1.0], clip_ratio_low=0.2, clip_ratio_high=0.28)
    out, grad = run("cispo", inp)
    logp = inp.log_prob.detach()[0]
    assert out.loss[0].tolist() == pytest.approx([-1.28 * 2 * logp[0].item(), -0.8 * 1 * logp[1].item()])
    assert grad.tolist() == pytest.approx([-2.56, -0.8])


def test_gpg_is_plain_policy_gradient():
    inp = make([1.3, 0.7], [0.5, -2.0])
    out, grad = run("gpg", inp)
    logp = inp.log_prob.detach()[0]
    assert out.loss[0].tolist() == pytest.approx([-0.5 * logp[0].item(), 2.0 * logp[1].item()])
    assert grad.tolist() == pytest.approx([-0.5, 2.0])


def test_sapo_gate_value_and_gradient():
    # A=+1, tau=1: g = sigmoid(r-1)*4; at r=1.5: 4*sigmoid(0.5) = 2.4492; dL/dlogp = -A g'(r) r, g' = 4 s(1-s)
    # A=-1, tau=1.05: g = sigmoid(1.05 (r-1)) * 4/1.05 at r=0.8
    inp = make([1.5, 0.8], [1.0, -1.0])
    out, grad = run("sapo", inp)
    sig = lambda x: 1 / (1 + math.exp(-x))  # noqa: E731
    g0 = 4 * sig(0.5)
    g1 = sig(1.05 * -0.2) * 4 / 1.05
    assert out.loss[0].tolist() == pytest.approx([-g0, g1])
    d0 = 4 * sig(0.5) * (1 - sig(0.5)) * 1.5
    d1 = 4 * sig(-0.21) * (1 - sig(-0.21)) * 0.8
    assert grad.tolist() == pytest.approx([-d0, d1])


def test_geo_mean_two_sequences():
    # seq 0: A=+1, log ratios [0.6, 0.0] with eps 0.4 -> clipped to [0.4, 0.0]; rho = exp(0.2); L = -exp(0.2)
    # seq 1: A=-1, log ratios [-0.6, 0.2] -> for A<0 the pessimistic clip keeps -0.6 -> -0.4? sgn=-1:
    #   -min(0.6, 0.4) = -0.4 for the first, -min(-0.2, -0.2) = 0.2 for the second -> rho = exp(-0.1); L = +exp(-0.1)
    logp_delta = torch.tensor([[0.6, 0.0], [-0.6, 0.2]], dtype=F64)
    old = torch.full((2, 2), -1.0, dtype=F64)
    inp = PolicyLossInput((old + logp_delta).requires_grad_(True), old,
                          torch.tensor([[1.0, 1.0], [-1.0, -1.0]], dtype=F64), torch.ones(2, 2),
                          config=PolicyLossConfig(clip_ratio_low=0.4, clip_ratio_high=0.4))
    out = get_policy_loss("geo_mean")(inp)
    assert out.loss[:, 0].tolist() == pytest.approx([-math.exp(0.2), math.exp(-0.1)])
    assert out.loss[:, 1].tolist() == out.loss[:, 0].tolist()  # every token carries the sequence loss


def test_clip_cov_stops_gradient_on_selected_tokens_reproducibly():
    gen_inputs = torch.Generator().manual_seed(0)
    old = torch.randn(4, 16, dtype=F64, generator=gen_inputs)
    delta = 0.05 * torch.randn(4, 16, dtype=F64, generator=gen_inputs)
    adv = 3 * torch.randn(4, 16, dtype=F64, generator=gen_inputs)
    cfg = PolicyLossConfig(clip_cov_ratio=0.1, clip_cov_lb=-100, clip_cov_ub=100)

    def once(seed):
        inp = PolicyLossInput((old + delta).requires_grad_(True), old, adv, torch.ones(4, 16), config=cfg,
                              generator=torch.Generator().manual_seed(seed))
        out = get_policy_loss("clip_cov")(inp)
        out.loss.sum().backward()
        return out, inp.log_prob.grad

    out_a, grad_a = once(1)
    out_b, grad_b = once(1)
    stopped = (grad_a == 0) & (out_a.loss == 0)
    assert int(stopped.sum()) == 6  # int(0.1 * 64) tokens
    assert torch.equal(grad_a, grad_b)  # same generator seed, same selection
    assert float(out_a.metrics["clip_cov_frac"]) == pytest.approx(6 / 64)
    ppo_like = get_policy_loss("ppo")(PolicyLossInput(old + delta, old, adv, torch.ones(4, 16), config=cfg))
    torch.testing.assert_close(out_a.loss[~stopped], ppo_like.loss[~stopped])


def test_kl_cov_penalises_top_covariance_tokens():
    # 4 tokens, ratio 0.5 -> k = 2. cov = (A - mean A)(logp - mean logp)
    old = torch.tensor([[-1.0, -1.0, -1.0, -1.0]], dtype=F64)
    logp = torch.tensor([[-0.5, -1.5, -0.9, -1.1]], dtype=F64, requires_grad=True)
    adv = torch.tensor([[2.0, -2.0, 0.1, 0.1]], dtype=F64)
    inp = PolicyLossInput(logp, old, adv, torch.ones(1, 4), config=PolicyLossConfig(kl_cov_ratio=0.5, kl_cov_coef=1.0))
    out = get_policy_loss("kl_cov")(inp)
    ratio = torch.exp(logp.detach() - old)[0]
    base = (-adv[0] * ratio).tolist()
    # covariances: A-mean = [1.95, -2.05, 0.05, 0.05]; logp-mean = [0.5, -0.5, 0.1, -0.1] -> tokens 0 and 1 on top
    expected = [base[0] + 0.5, base[1] + 0.5, base[2], base[3]]
    assert out.loss[0].tolist() == pytest.approx(expected)
    assert float(out.metrics["kl_cov_frac"]) == 0.5


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_every_loss_shape_masking_gradients_and_metrics(name):
    gen = torch.Generator().manual_seed(3)
    old = torch.randn(3, 6, dtype=F64, generator=gen)
    logp = (old + 0.3 * torch.randn(3, 6, dtype=F64, generator=gen)).requires_grad_(True)
    adv = torch.randn(3, 6, dtype=F64, generator=gen)
    mask = torch.ones(3, 6)
    mask[1, 4:] = 0
    out = get_policy_loss(name)(PolicyLossInput(logp, old, adv, mask))
    assert out.loss.shape == (3, 6) and (out.loss[mask == 0] == 0).all()
    out.loss.sum().backward()
    assert torch.isfinite(logp.grad).all() and (logp.grad[mask == 0] == 0).all()
    assert {"clip_frac_upper", "clip_frac_lower", "approx_kl", "ratio_mean", "ratio_var"} <= set(out.metrics)


def test_names_and_unknown():
    assert {"ppo", "gspo", "cispo", "gpg", "clip_cov", "kl_cov", "sapo", "geo_mean"} == set(POLICY_LOSSES.names())
    with pytest.raises(UnknownNameError, match="unknown policy loss 'ppoo'; did you mean 'ppo'"):
        get_policy_loss("ppoo")
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        PolicyLossConfig(clip_ratio_c=1.0)


def test_value_loss_by_hand():
    # V=1.0, V_old=0.0, R=2.0, eps 0.5: unclipped (1-2)^2=1, clipped V'=0.5 -> (0.5-2)^2 = 2.25 -> 0.5*2.25
    # V=1.8, V_old=1.6, R=2.0: unclipped 0.04, clipped (inside range) 0.04 -> 0.02
    values = torch.tensor([[1.0, 1.8, 5.0]], dtype=F64)
    old = torch.tensor([[0.0, 1.6, 0.0]], dtype=F64)
    returns = torch.tensor([[2.0, 2.0, 0.0]], dtype=F64)
    loss, metrics = value_loss(values, old, returns, torch.tensor([[1, 1, 0]]), 0.5)
    assert loss[0].tolist() == pytest.approx([1.125, 0.02, 0.0])
    assert float(metrics["vf_clip_frac"]) == 0.5 and float(metrics["vpred_mean"]) == pytest.approx(1.4)


def test_entropy_from_logits():
    gen = torch.Generator().manual_seed(0)
    logits = 5 * torch.randn(4, 7, dtype=F64, generator=gen)
    p = torch.softmax(logits, -1)
    torch.testing.assert_close(entropy_from_logits(logits), -(p * p.log()).sum(-1))
    assert entropy_from_logits(torch.zeros(2, 10)).tolist() == pytest.approx([math.log(10)] * 2)
    assert torch.isfinite(entropy_from_logits(torch.tensor([[1e4, 0.0, -1e4]]))).all()
