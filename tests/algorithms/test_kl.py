import math

import pytest
import torch

from rlplat.algorithms.kl import (
    KL_ESTIMATORS,
    AdaptiveKLController,
    FixedKLController,
    KLInput,
    get_kl_estimator,
    kl_estimator_names,
    kl_penalized_rewards,
    kl_penalty,
    make_kl_controller,
)
from rlplat.registry import UnknownNameError

# Δ = logp − ref = [0.5, −1.0, 0.0]
LOGP = torch.tensor([[-1.0, -2.0, -0.3]], dtype=torch.float64)
REF = torch.tensor([[-1.5, -1.0, -0.3]], dtype=torch.float64)


def _inp(logp=LOGP, ref=REF, **kw):
    return KLInput(log_prob=logp.clone().requires_grad_(True), ref_log_prob=ref, **kw)


@pytest.mark.parametrize(
    "name, expected",
    [
        ("k1", [0.5, -1.0, 0.0]),
        ("kl", [0.5, -1.0, 0.0]),
        ("abs", [0.5, 1.0, 0.0]),
        ("k2", [0.125, 0.5, 0.0]),  # ½Δ²
        ("mse", [0.125, 0.5, 0.0]),
        # exp(−Δ) + Δ − 1: exp(−0.5) − 0.5 = 0.10653; exp(1) − 2 = 0.71828; 0
        ("k3", [math.exp(-0.5) - 0.5, math.e - 2.0, 0.0]),
        ("low_var_kl", [math.exp(-0.5) - 0.5, math.e - 2.0, 0.0]),
    ],
)
def test_hand_values(name, expected):
    out = kl_penalty(name, _inp())
    torch.testing.assert_close(out, torch.tensor([expected], dtype=torch.float64))


def test_k3_is_clamped():
    # Δ = −30: exp(30) is huge; the estimate is clamped to 10 and stays finite.
    out = kl_penalty("k3", _inp(torch.tensor([[-30.0]]), torch.tensor([[0.0]])))
    assert out.item() == 10.0


def test_gradients_of_base_estimators():
    # d/dlogp: k1 -> 1, k2 -> Δ, k3 -> 1 − exp(−Δ)
    delta = (LOGP - REF)[0]
    for name, expected in [("k1", torch.ones(3)), ("k2", delta), ("k3", 1 - torch.exp(-delta))]:
        inp = _inp()
        kl_penalty(name, inp).sum().backward()
        torch.testing.assert_close(inp.log_prob.grad[0], expected.double())


@pytest.mark.parametrize("base", ["k1", "abs", "k3", "low_var_kl", "mse"])
def test_straight_through_has_base_value_and_k2_gradient(base):
    plain, st = _inp(), _inp()
    value = kl_penalty(base + "+", st)
    torch.testing.assert_close(value, kl_penalty(base, plain).detach())
    value.sum().backward()
    torch.testing.assert_close(st.log_prob.grad, LOGP - REF)  # gradient of ½Δ² is Δ


def test_k3_plus_explicitly():
    inp = _inp()
    out = kl_penalty("k3+", inp)
    # value of k3 at Δ = 0.5: exp(−0.5) − 0.5
    assert out[0, 0].item() == pytest.approx(math.exp(-0.5) - 0.5)
    out.sum().backward()
    # k2 gradient: Δ = 0.5, −1, 0 (k3 would give 1 − exp(−0.5) = 0.393 at the first token)
    torch.testing.assert_close(inp.log_prob.grad, torch.tensor([[0.5, -1.0, 0.0]], dtype=torch.float64))


def test_names_and_unknown():
    names = kl_estimator_names()
    for name in ["k1", "kl", "abs", "k2", "mse", "k3", "low_var_kl", "k3+", "low_var_kl+"]:
        assert name in names
        get_kl_estimator(name)
    assert set(KL_ESTIMATORS.names()) < set(names)
    assert "full" not in names  # the roles exchange per-token log-probs, never vocabulary-sized logits
    with pytest.raises(UnknownNameError, match=r"did you mean 'low_var_kl\+'.*known: abs"):
        get_kl_estimator("lowvar_kl+")
    with pytest.raises(UnknownNameError, match="did you mean 'low_var_kl'"):
        get_kl_estimator("low_var_k")


def test_user_registered_estimator_gets_a_plus_variant():
    def doubled(inp):
        return 2 * (inp.log_prob - inp.ref_log_prob)

    with KL_ESTIMATORS.temporary("doubled", doubled):
        inp = _inp()
        out = kl_penalty("doubled+", inp)
        torch.testing.assert_close(out, 2 * (LOGP - REF))
        assert "doubled+" in kl_estimator_names()
    assert "doubled" not in KL_ESTIMATORS


def test_kl_in_reward():
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    kl = torch.tensor([[0.1, 0.2, 0.3], [0.4, 0.5, 0.6]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    out = kl_penalized_rewards(scores, kl, mask, beta=0.5)
    torch.testing.assert_close(out, torch.tensor([[-0.05, -0.1, 0.85], [-0.2, 1.75, 0.0]]))


def test_controllers():
    fixed = make_kl_controller("fixed", 0.1, target=0.1, horizon=10000)
    assert isinstance(fixed, FixedKLController)
    fixed.update(5.0, 64)
    assert fixed.value == 0.1

    ctl = make_kl_controller("adaptive", 0.1, target=0.02, horizon=1000)
    assert isinstance(ctl, AdaptiveKLController)
    ctl.update(0.03, 100)  # error = 0.03/0.02 − 1 = 0.5 -> clipped 0.2; β *= 1 + 0.2·100/1000
    assert ctl.value == pytest.approx(0.1 * 1.02)
    ctl.update(0.019, 100)  # error = −0.05; β *= 1 − 0.005
    assert ctl.value == pytest.approx(0.1 * 1.02 * 0.995)
    with pytest.raises(ValueError, match="target > 0"):
        make_kl_controller("adaptive", 0.1, target=0.0, horizon=10000)
    with pytest.raises(UnknownNameError, match="did you mean 'adaptive'"):
        make_kl_controller("adaptve", 0.1, target=0.1, horizon=10000)
