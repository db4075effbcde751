"""Regression tests of formula defects, each against a hand-computed value (docs/algorithms.md).

Each test failed before its fix: the Dr. GRPO aggregation was num_seqs times too large, discounted
returns restarted at a masked (observation) token inside a response, and kl_cov penalised no token when
a call had fewer than 1/kl_cov_ratio valid tokens.
"""

import pytest
import torch

from rlplat.algorithms import AdvantageInput, AdvantageOptions, LossDenominators, aggregate_loss, compute_advantages
from rlplat.algorithms.policy_losses import PolicyLossConfig, PolicyLossInput, get_policy_loss

F64 = torch.float64


# ---------------------------------------------------------------------------- Dr. GRPO scale
def test_dr_grpo_aggregation_divides_by_sequences_and_constant():
    # Two responses of a group, token losses [1, 2, -] and [4, -, -], C = 5:
    # (1/G) Σ_i Σ_t L / C = ((1 + 2) + 4) / (2 x 5) = 0.7   (the old code gave 7 / 5 = 1.4)
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=F64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    value = aggregate_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=5)
    assert value.item() == pytest.approx(0.7, rel=1e-12)
    (grad,) = torch.autograd.grad(value, loss)
    assert grad.flatten().tolist() == pytest.approx([0.1, 0.1, 0.0, 0.1, 0.0, 0.0])  # 1 / (N C) per valid token


def test_dr_grpo_micro_batch_uses_the_global_sequence_count():
    # The first row alone, inside a mini-batch of 4 sequences: (1 + 2) / (4 x 5) = 0.15
    loss = torch.tensor([[1.0, 2.0, 3.0]], dtype=F64)
    value = aggregate_loss(loss, torch.tensor([[1, 1, 0]]), "seq-mean-token-sum-norm",
                           LossDenominators(num_tokens=9, num_seqs=4), loss_scale_factor=5)
    assert value.item() == pytest.approx(0.15, rel=1e-12)


# ---------------------------------------------------------------------------- returns across holes
# One multi-turn response: turn 1 (tokens 0-1), tool output (2-3, masked), turn 2 (4-5); reward 1 at the end.
TURN_MASK = torch.tensor([[1, 1, 0, 0, 1, 1]])
TURN_REWARD = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 1.0]], dtype=F64)


@pytest.mark.parametrize("gamma, expected", [
    (1.0, [1.0, 1.0, 0.0, 0.0, 1.0, 1.0]),  # the first turn gets the reward (old code: 0, 0)
    # γ counts valid tokens: t5 = 1, t4 = 0.5, t1 = 0.25, t0 = 0.125 (old code: t1 = t0 = 0)
    (0.5, [0.125, 0.25, 0.0, 0.0, 0.5, 1.0]),
])
def test_reinforce_pp_return_carries_across_observation_tokens(gamma, expected):
    out = compute_advantages("reinforce_pp", AdvantageInput(TURN_REWARD, TURN_MASK,
                                                            options=AdvantageOptions(gamma=gamma)))
    assert out.returns[0].tolist() == pytest.approx(expected)


def test_reinforce_pp_two_rows_whitened_over_both_turns():
    # Row 0 the multi-turn response (returns 1 on its 4 valid tokens), row 1 a failed single-turn one
    # (returns 0 on 2 tokens): 6 valid values [1, 1, 1, 1, 0, 0], mean 2/3; Σ (x - 2/3)² = 4 x 1/9 +
    # 2 x 4/9 = 4/3, unbiased var = 4/3 / 5 = 4/15, std = 0.5164; row 0 gets (1/3)/0.5164 = 0.6455
    # on *every* turn (old code: the first turn was whitened from a return of 0: negative).
    rewards = torch.cat([TURN_REWARD, torch.zeros(1, 6, dtype=F64)])
    mask = torch.cat([TURN_MASK, torch.tensor([[1, 1, 0, 0, 0, 0]])])
    out = compute_advantages("reinforce_pp", AdvantageInput(rewards, mask))
    std = (4 / 15) ** 0.5 + 1e-8
    assert out.advantages[0].tolist() == pytest.approx([1 / 3 / std] * 2 + [0, 0] + [1 / 3 / std] * 2)
    assert out.advantages[1].tolist() == pytest.approx([-2 / 3 / std] * 2 + [0] * 4)


@pytest.mark.parametrize("gamma, expected", [
    (1.0, [0.6, 0.6, 0.0, 0.0, 0.6, 0.6]),  # G − b, b = 0.4 (old code: the first turn got −b = −0.4)
    (0.5, [0.125 - 0.4, 0.25 - 0.4, 0.0, 0.0, 0.5 - 0.4, 1.0 - 0.4]),
])
def test_remax_return_carries_across_observation_tokens(gamma, expected):
    inp = AdvantageInput(TURN_REWARD, TURN_MASK, baseline_scores=torch.tensor([0.4], dtype=F64),
                         options=AdvantageOptions(gamma=gamma))
    assert compute_advantages("remax", inp).advantages[0].tolist() == pytest.approx(expected)


# ---------------------------------------------------------------------------- kl_cov floor and default
def test_kl_cov_penalises_at_least_one_token_with_the_default_coefficient():
    # 4 valid tokens, kl_cov_ratio 2e-3: int(0.008) = 0 -> floored to 1 (old code: none penalised).
    # A = [2, -2, 0.1, 0.1], logp = [-0.5, -1.5, -0.9, -1.1], old = -1: centred covariance
    # [0.975, 1.025, 0.005, -0.005] -> token 1 is penalised by 0.1 x |logp - old| = 0.1 x 0.5 = 0.05.
    assert PolicyLossConfig().kl_cov_coef == 0.1
    logp = torch.tensor([[-0.5, -1.5, -0.9, -1.1]], dtype=F64)
    old = torch.full_like(logp, -1.0)
    adv = torch.tensor([[2.0, -2.0, 0.1, 0.1]], dtype=F64)
    out = get_policy_loss("kl_cov")(PolicyLossInput(logp, old, adv, torch.ones_like(logp)))
    base = -adv * torch.exp(logp - old)
    assert (out.loss - base)[0].tolist() == pytest.approx([0.0, 0.05, 0.0, 0.0])
    assert float(out.metrics["kl_cov_frac"]) == 0.25
