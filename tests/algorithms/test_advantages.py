"""Advantage estimators against hand-derived values and against per-sample loop formulations."""

import math
from collections import defaultdict

import pytest
import torch

from rlplat.algorithms import (
    ADVANTAGE_ESTIMATORS,
    AdvantageInput,
    AdvantageOptions,
    AdvantageOutput,
    compute_advantages,
    get_advantage_estimator,
)
from rlplat.registry import UnknownNameError

F64 = torch.float64


def outcome(scores, lengths, length=4):
    """Token rewards with each score on the last valid token, and right-padded masks."""
    rewards = torch.zeros(len(scores), length, dtype=F64)
    mask = torch.zeros(len(scores), length, dtype=torch.long)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        mask[i, :n] = 1
        rewards[i, n - 1] = s
    return rewards, mask


def first_token(out: AdvantageOutput) -> list[float]:
    return out.advantages[:, 0].tolist()


# ------------------------------------------------------------------ hand-derived values
def test_grpo_hand_values():
    # group 0: scores 1, 0 -> mean 0.5, std (unbiased) = sqrt(0.5) = 0.70711 -> ±0.5 / (0.70711 + 1e-6)
    # group 1: scores 2, 2, 2 -> zero variance -> exactly 0; group 2: one sample (3) -> mean 0, std 1 -> 3/(1+1e-6)
    rewards, mask = outcome([1, 0, 2, 2, 2, 3], [2, 3, 1, 4, 2, 1])
    out = compute_advantages("grpo", AdvantageInput(rewards, mask, torch.tensor([0, 0, 1, 1, 1, 2])))
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert first_token(out) == pytest.approx([a, -a, 0, 0, 0, 3 / (1 + 1e-6)], abs=1e-12)
    assert out.zero_variance.tolist() == [False, False, True, True, True, False]
    # broadcast over valid tokens only
    assert out.advantages[0].tolist() == pytest.approx([a, a, 0, 0])
    assert torch.equal(out.returns, out.advantages)


def test_grpo_scale_batch_and_none():
    rewards, mask = outcome([1, 0, 0, 0], [1, 1, 1, 1])
    g = torch.tensor([0, 0, 1, 1])
    # batch std of [1,0,0,0] = sqrt(0.25) = 0.5 (unbiased: var = (0.5625 + 3*0.0625)/3 = 0.25)
    out = compute_advantages("grpo", AdvantageInput(rewards, mask, g, options=AdvantageOptions(scale="batch")))
    assert first_token(out) == pytest.approx([0.5 / (0.5 + 1e-6), -0.5 / (0.5 + 1e-6), 0, 0])
    out = compute_advantages("grpo", AdvantageInput(rewards, mask, g, options=AdvantageOptions(scale="none")))
    assert first_token(out) == pytest.approx([0.5, -0.5, 0, 0])
    with pytest.raises(ValueError, match="scale='groups' is not one of"):
        compute_advantages("grpo", AdvantageInput(rewards, mask, g, options=AdvantageOptions(scale="groups")))


def test_dr_grpo_dapo_rloo_hand_values():
    rewards, mask = outcome([1, 0, 0, 4], [1, 2, 1, 3])
    g = torch.tensor([0, 0, 0, 1])
    # dr_grpo: mean 1/3 -> 2/3, -1/3, -1/3; single sample 4 -> 4 (mean 0)
    assert first_token(compute_advantages("dr_grpo", AdvantageInput(rewards, mask, g))) == pytest.approx(
        [2 / 3, -1 / 3, -1 / 3, 4])
    # rloo: G/(G-1) (s - mean) = 1.5 * [2/3, -1/3, -1/3] = [1, -0.5, -0.5]; single sample keeps its score
    assert first_token(compute_advantages("rloo", AdvantageInput(rewards, mask, g))) == pytest.approx(
        [1, -0.5, -0.5, 4])
    # dapo = grpo: std of [1,0,0] = sqrt(1/3)
    s = math.sqrt(1 / 3) + 1e-6
    dapo = compute_advantages("dapo", AdvantageInput(rewards, mask, g))
    assert first_token(dapo) == pytest.approx([(2 / 3) / s, (-1 / 3) / s, (-1 / 3) / s, 4 / (1 + 1e-6)])


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "dapo", "rloo"])
def test_zero_variance_groups_are_exactly_zero(name):
    # 0.1 three times: the float mean is not exactly 0.1, the advantage must still be exactly 0
    rewards, mask = outcome([0.1, 0.1, 0.1, 1.0, 0.0], [2, 3, 1, 1, 2])
    out = compute_advantages(name, AdvantageInput(rewards, mask, torch.tensor([7, 7, 7, 3, 3])))
    assert (out.advantages[:3] == 0).all()
    assert out.zero_variance.tolist() == [True, True, True, False, False]


def test_opo_gpg_passk_hand_values():
    rewards, mask = outcome([1, 0, 1, 1], [1, 3, 2, 4])
    g = torch.tensor([0, 0, 1, 1])
    # opo group 0: b = (1*1 + 3*0)/(1+3) = 0.25 -> 0.75, -0.25; group 1 all equal -> 0
    assert first_token(compute_advantages("opo", AdvantageInput(rewards, mask, g))) == pytest.approx(
        [0.75, -0.25, 0, 0])
    # gpg: alpha = 4 samples / 3 non-zero = 4/3; group 0: (1 - 0.5) * 4/3 = 2/3
    assert first_token(compute_advantages("gpg", AdvantageInput(rewards, mask, g))) == pytest.approx(
        [2 / 3, -2 / 3, 0, 0])
    # passk: group [3, 1, 3]: the first best gets (3 - 3) = 0... use [3, 1, 2]: best 3, second 2
    rewards, mask = outcome([3, 1, 2, 5, 5], [1, 1, 1, 1, 1])
    g = torch.tensor([0, 0, 0, 1, 1])
    out = compute_advantages("grpo_passk", AdvantageInput(rewards, mask, g,
                                                          options=AdvantageOptions(norm_by_std=False)))
    assert first_token(out) == pytest.approx([1, 0, 0, 0, 0])  # ties: first best gets 5 - 5 = 0
    out = compute_advantages("grpo_passk", AdvantageInput(rewards, mask, g))
    assert first_token(out)[0] == pytest.approx(1 / (1.0 + 1e-6))  # std of [3,1,2] = 1
    with pytest.raises(ValueError, match="at least 2 responses"):
        compute_advantages("grpo_passk", AdvantageInput(rewards, mask, torch.tensor([0, 0, 0, 1, 2])))


def test_reinforce_pp_and_remax_hand_values():
    # one sequence, rewards [1, 0, 2] (3 valid of 4), gamma 0.5: G = [1 + 0.5*(0 + 0.5*2), 0 + 0.5*2, 2, 0]
    rewards = torch.tensor([[1.0, 0.0, 2.0, 0.0], [0.0, 1.0, 0.0, 0.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    opts = AdvantageOptions(gamma=0.5)
    out = compute_advantages("reinforce_pp", AdvantageInput(rewards, mask, options=opts))
    assert out.returns.tolist() == [[1.5, 1.0, 2.0, 0.0], [0.5, 1.0, 0.0, 0.0]]
    valid = torch.tensor([1.5, 1.0, 2.0, 0.5, 1.0], dtype=F64)
    whitened = (valid - valid.mean()) / (valid.std() + 1e-8)
    assert out.advantages[mask.bool()].tolist() == pytest.approx(whitened.tolist())
    remax = compute_advantages(
        "remax", AdvantageInput(rewards, mask, baseline_scores=torch.tensor([1.0, 2.0]), options=opts))
    assert remax.advantages.tolist() == [[0.5, 0.0, 1.0, 0.0], [-1.5, -1.0, 0.0, 0.0]]


def test_reinforce_pp_baseline_hand_values():
    rewards, mask = outcome([1, 0], [1, 2])
    out = compute_advantages("reinforce_pp_baseline", AdvantageInput(rewards, mask, torch.tensor([0, 0])))
    # centred scores 0.5 (1 token), -0.5 (2 tokens) -> values [0.5, -0.5, -0.5], mean -1/6, std 0.57735
    valid = torch.tensor([0.5, -0.5, -0.5], dtype=F64)
    assert out.advantages[mask.bool()].tolist() == pytest.approx(((valid - valid.mean()) / (valid.std() + 1e-8)).tolist())


def test_gae_hand_values():
    # r = [0, 1], V = [0.5, 0.2], gamma 0.9, lam 0.8, then a masked token
    # t=1: delta = 1 + 0 - 0.2 = 0.8, A = 0.8; t=0: delta = 0 + 0.9*0.2 - 0.5 = -0.32, A = -0.32 + 0.72*0.8 = 0.256
    rewards = torch.tensor([[0.0, 1.0, 0.0]], dtype=F64)
    values = torch.tensor([[0.5, 0.2, 9.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0]])
    out = compute_advantages("gae", AdvantageInput(rewards, mask, values=values,
                                                   options=AdvantageOptions(gamma=0.9, lam=0.8)))
    assert out.returns[0].tolist() == pytest.approx([0.756, 1.0, 0.0])
    a = torch.tensor([0.256, 0.8], dtype=F64)
    assert out.advantages[0, :2].tolist() == pytest.approx(((a - a.mean()) / (a.std() + 1e-8)).tolist())
    assert out.advantages[0, 2] == 0


# ------------------------------------------------------------------ independent loop formulations
def random_batch(seed, batch=24, length=9, groups=6, holes=False):
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, length + 1, (batch,), generator=gen)
    mask = (torch.arange(length)[None] < lengths[:, None]).long()
    if holes:
        mask = mask * (torch.rand(batch, length, generator=gen) > 0.25).long()
        mask[:, 0] = 1
    rewards = torch.randn(batch, length, dtype=F64, generator=gen) * mask
    ids = torch.randint(0, groups, (batch,), generator=gen)
    values = torch.randn(batch, length, dtype=F64, generator=gen)
    return rewards, mask, ids, values


def loop_group_scores(rewards, mask, ids):
    scores = [sum(r * m for r, m in zip(row.tolist(), mrow.tolist())) for row, mrow in zip(rewards, mask)]
    groups = defaultdict(list)
    for s, g in zip(scores, ids.tolist()):
        groups[g].append(s)
    return scores, groups


def loop_std(xs):
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


@pytest.mark.parametrize("seed", range(5))
def test_grpo_and_rloo_match_loops(seed):
    rewards, mask, ids, _ = random_batch(seed)
    scores, groups = loop_group_scores(rewards, mask, ids)
    expected_grpo, expected_rloo = [], []
    for s, g in zip(scores, ids.tolist()):
        xs = groups[g]
        if len(xs) == 1:
            expected_grpo.append(s / (1 + 1e-6))
            expected_rloo.append(s)
        else:
            mean = sum(xs) / len(xs)
            expected_grpo.append((s - mean) / (loop_std(xs) + 1e-6))
            expected_rloo.append(s - (sum(xs) - s) / (len(xs) - 1))
    for name, expected in (("grpo", expected_grpo), ("rloo", expected_rloo)):
        out = compute_advantages(name, AdvantageInput(rewards, mask, ids))
        exp = torch.tensor(expected, dtype=F64)[:, None] * mask
        torch.testing.assert_close(out.advantages, exp)


def loop_whiten(values, mask):
    flat = [v for row, mrow in zip(values, mask.tolist()) for v, m in zip(row, mrow) if m]
    mean, std = sum(flat) / len(flat), loop_std(flat)
    return [[(v - mean) / (std + 1e-8) if m else 0.0 for v, m in zip(row, mrow)]
            for row, mrow in zip(values, mask.tolist())]


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_pp_matches_loop(seed, gamma):
    rewards, mask, _, _ = random_batch(seed, holes=seed % 2 == 1)
    returns = []
    for row, mrow in zip(rewards.tolist(), mask.tolist()):
        g, out = 0.0, [0.0] * len(row)
        for t in reversed(range(len(row))):
            g = (row[t] + gamma * g) * mrow[t]  # restart where the mask is 0
            out[t] = g
        returns.append(out)
    res = compute_advantages("reinforce_pp", AdvantageInput(rewards, mask, options=AdvantageOptions(gamma=gamma)))
    torch.testing.assert_close(res.returns, torch.tensor(returns, dtype=F64))
    torch.testing.assert_close(res.advantages, torch.tensor(loop_whiten(returns, mask), dtype=F64))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("holes", [False, True])
def test_gae_matches_loop_over_valid_tokens(seed, holes):
    rewards, mask, _, values = random_batch(seed, holes=holes)
    gamma, lam = 0.95, 0.9
    adv_rows, ret_rows = [], []
    for r, v, m in zip(rewards.tolist(), values.tolist(), mask.tolist()):
        valid = [t for t in range(len(m)) if m[t]]  # GAE over the valid tokens only, in order
        adv, ret = [0.0] * len(m), [0.0] * len(m)
        last = 0.0
        for k in reversed(range(len(valid))):
            t = valid[k]
            next_v = v[valid[k + 1]] if k + 1 < len(valid) else 0.0
            last = r[t] + gamma * next_v - v[t] + gamma * lam * last
            adv[t], ret[t] = last, last + v[t]
        adv_rows.append(adv)
        ret_rows.append(ret)
    out = compute_advantages("gae", AdvantageInput(rewards, mask, values=values,
                                                   options=AdvantageOptions(gamma=gamma, lam=lam)))
    torch.testing.assert_close(out.returns, torch.tensor(ret_rows, dtype=F64))
    torch.testing.assert_close(out.advantages, torch.tensor(loop_whiten(adv_rows, mask), dtype=F64))


# ------------------------------------------------------------------ registry behaviour
@pytest.mark.parametrize("name", ADVANTAGE_ESTIMATORS.names())
def test_every_estimator_shapes_and_masking(name):
    rewards, mask, ids, values = random_batch(0)
    ids = torch.arange(len(ids)) // 4  # groups of 4 for the estimators that need them
    out = compute_advantages(name, AdvantageInput(rewards, mask, ids, values=values,
                                                  baseline_scores=torch.zeros(len(ids), dtype=F64)))
    assert out.advantages.shape == rewards.shape == out.returns.shape
    assert (out.advantages[mask == 0] == 0).all() and torch.isfinite(out.advantages).all()


def test_expected_names_and_requirements():
    expected = {"grpo", "dr_grpo", "dapo", "gae", "rloo", "reinforce_pp", "reinforce_pp_baseline", "remax",
                "opo", "gpg", "grpo_passk"}
    assert expected == set(ADVANTAGE_ESTIMATORS.names())
    assert get_advantage_estimator("gae").needs_values and get_advantage_estimator("remax").needs_baseline
    assert get_advantage_estimator("grpo").min_group_size == 2 and get_advantage_estimator("reinforce_pp").min_group_size == 1


@pytest.mark.parametrize("name, field", [("grpo", "group_ids"), ("gae", "values"), ("remax", "baseline_scores")])
def test_missing_inputs_name_the_field(name, field):
    rewards, mask = outcome([1.0], [1])
    with pytest.raises(ValueError, match=f"'{name}' needs AdvantageInput.{field}"):
        compute_advantages(name, AdvantageInput(rewards, mask))


def test_shape_mismatch():
    with pytest.raises(ValueError, match=r"must both be \[batch, response_len\]"):
        compute_advantages("grpo", AdvantageInput(torch.zeros(2, 3), torch.ones(2, 4), torch.zeros(2)))


def test_user_estimator_selectable_and_unknown_name_message():
    def constant(inp):
        adv = inp.response_mask.to(inp.token_level_rewards.dtype) * 0.5
        return AdvantageOutput(advantages=adv, returns=adv)

    with ADVANTAGE_ESTIMATORS.temporary("constant_half", constant):
        rewards, mask = outcome([1.0, 0.0], [1, 2])
        out = compute_advantages("constant_half", AdvantageInput(rewards, mask))
        assert out.advantages.sum() == 1.5
    assert "constant_half" not in ADVANTAGE_ESTIMATORS
    with pytest.raises(UnknownNameError) as info:
        get_advantage_estimator("grpoo")
    message = str(info.value)
    assert message.startswith("unknown advantage estimator 'grpoo'; did you mean 'grpo'? known: dapo, dr_grpo, gae")
