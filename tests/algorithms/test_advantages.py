"""Advantage estimators against hand-derived values, against per-sample loop formulations, and the registry."""

import math
import re
import statistics
from collections import defaultdict

import pytest
import torch

from rlplat.algorithms.advantages import (
    ADVANTAGE_ESTIMATORS,
    SCAN_BLOCK,
    AdvantageInput,
    AdvantageOptions,
    AdvantageOutput,
    compute_advantages,
    estimator_spec,
    get_advantage_estimator,
)
from rlplat.algorithms.masked import group_stats
from rlplat.registry import DuplicateNameError, UnknownNameError

F64 = torch.float64
EPS = 1e-6  # AdvantageOptions.epsilon default
GROUP_ESTIMATORS = ("dapo", "dr_grpo", "gpg", "grpo", "grpo_passk", "opo", "reinforce_pp_baseline", "rloo")
BUILTIN = GROUP_ESTIMATORS + ("gae", "reinforce_pp", "remax")


def outcome(scores, lengths, length=4):
    """Each score on its response's last valid token; right-padded bool masks; 9.0 on the first masked
    token, which every estimator must ignore."""
    rewards = torch.zeros(len(scores), length, dtype=F64)
    mask = torch.zeros(len(scores), length, dtype=torch.bool)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        mask[i, :n] = True
        rewards[i, n - 1] = s
        if n < length:
            rewards[i, n] = 9.0
    return rewards, mask


def run(name, scores, lengths, ids, **options):
    rewards, mask = outcome(scores, lengths)
    inp = AdvantageInput(rewards, mask, torch.tensor(ids), options=AdvantageOptions(**options))
    out = compute_advantages(name, inp)
    return out, mask


def per_sequence(out: AdvantageOutput, mask) -> list[float]:
    """The per-response advantage, after checking it sits on every valid token and nowhere else."""
    first = out.advantages[:, 0]
    assert torch.equal(out.advantages, first[:, None] * mask), "not broadcast over valid tokens only"
    return first.tolist()


# ------------------------------------------------------------------ grpo family: hand-derived values
def test_grpo_hand_values():
    # group 7 at positions 0, 2: scores 1, 0 -> mean 0.5, std sqrt((0.25 + 0.25) / 1) = 0.70711
    #   -> A = ±0.5 / (0.70711 + 1e-6); group 3 at positions 1, 3: scores 0, 1 -> the mirror image
    # group 5: scores 2, 5, 8 -> mean 5, std sqrt((9 + 0 + 9) / 2) = 3 -> A = -3, 0, 3 over (3 + 1e-6)
    out, mask = run("grpo", [1, 0, 0, 1, 2, 5, 8], [2, 3, 1, 4, 1, 2, 3], [7, 3, 7, 3, 5, 5, 5])
    a = 0.5 / (math.sqrt(0.5) + EPS)
    b = 3 / (3 + EPS)
    assert per_sequence(out, mask) == pytest.approx([a, -a, -a, a, -b, 0, b], rel=1e-12)
    assert out.returns is out.advantages  # no critic: returns = advantages, as verl/TRL
    assert out.zero_variance.tolist() == [False] * 7


@pytest.mark.parametrize("name, expected", [("grpo", 3 / (1 + EPS)), ("dapo", 3 / (1 + EPS)), ("dr_grpo", 3.0),
                                            ("rloo", 3.0)])
def test_group_of_one_uses_mean_0_and_std_1(name, expected):
    # the lone response (id 4, score 3) has baseline 0 and std 1: A = 3 / (1 + eps), or 3 unscaled
    out, mask = run(name, [1, 0, 3], [1, 2, 3], [0, 0, 4])
    assert per_sequence(out, mask)[2] == pytest.approx(expected, rel=1e-12)
    assert out.zero_variance.tolist() == [False, False, False]  # a group of one is not "zero variance"


def test_grpo_scale_batch_and_none():
    scores, lengths, ids = [1, 0, 0, 0, 2], [1, 2, 1, 3, 1], [0, 0, 1, 1, 9]
    # batch std of [1, 0, 0, 0, 2]: mean 0.6, squares 0.16 + 0.36 * 3 + 1.96 = 3.2, / 4 = 0.8 -> std 0.89443
    # means stay per group: group 0 -> ±0.5; group 1 zero variance -> 0; lone 2 -> mean 0 -> 2
    out, mask = run("grpo", scores, lengths, ids, scale="batch")
    s = math.sqrt(0.8) + EPS
    assert per_sequence(out, mask) == pytest.approx([0.5 / s, -0.5 / s, 0, 0, 2 / s], rel=1e-12)
    out, mask = run("grpo", scores, lengths, ids, scale="none")
    assert per_sequence(out, mask) == pytest.approx([0.5, -0.5, 0, 0, 2], rel=1e-12)


def test_bad_scale_and_f_norm_raise():
    for scale in ("group", "batch", "none"):
        AdvantageOptions(scale=scale)
    with pytest.raises(ValueError, match=re.escape("AdvantageOptions.scale='groups' is not one of")):
        AdvantageOptions(scale="groups")
    with pytest.raises(ValueError, match="gpg_f_norm must be > 0"):
        AdvantageOptions(gpg_f_norm=0.0)


def test_dr_grpo_hand_values_and_ignores_scale():
    # group 0: scores 1, 0, 0 -> mean 1/3 -> 2/3, -1/3, -1/3 (no std division); lone 4 -> 4
    for scale in ("group", "batch"):
        out, mask = run("dr_grpo", [1, 0, 0, 4], [1, 2, 1, 3], [0, 0, 0, 1], scale=scale)
        assert per_sequence(out, mask) == pytest.approx([2 / 3, -1 / 3, -1 / 3, 4], rel=1e-12)


def test_dapo_is_grpo_and_flags_exactly_the_zero_variance_groups():
    # groups: 0 -> [1, 1] (equal), 1 -> [0, 1], 2 -> [2] (alone: not flagged), 3 -> [0.1, 0.1, 0.1] (equal)
    args = ([1, 0, 1, 2, 0.1, 0.1, 0.1, 1], [1, 2, 3, 1, 2, 4, 1, 2], [0, 1, 0, 2, 3, 3, 3, 1])
    for scale in ("group", "batch", "none"):
        dapo, _ = run("dapo", *args, scale=scale)
        grpo, _ = run("grpo", *args, scale=scale)
        assert torch.equal(dapo.advantages, grpo.advantages)
        assert dapo.zero_variance.tolist() == [True, False, True, False, True, True, True, False]
    # group 1 holds scores 0, 1: mean 0.5, std 0.70711
    assert dapo.advantages[1, 0] == -0.5 and grpo.advantages[7, 0] == 0.5  # scale "none" from the last loop


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "dapo", "rloo"])
def test_zero_variance_groups_are_exactly_zero(name, scale):
    # 0.1 three times: the float mean is 0.30000000000000004 / 3 != 0.1, so only an explicit rule gives 0
    scores = torch.tensor([0.1, 0.1, 0.1], dtype=F64)
    assert group_stats(scores, torch.zeros(3, dtype=torch.long)).mean[0] != 0.1
    out, _ = run(name, [0.1, 0.1, 0.1, 1.0, 0.0], [2, 3, 1, 1, 2], [7, 7, 7, 3, 3], scale=scale)
    assert (out.advantages[:3] == 0).all()
    assert (out.advantages[3:, 0] != 0).all()
    assert out.zero_variance.tolist() == [True, True, True, False, False]


def test_rloo_hand_values():
    # group 0: scores 1, 0, 0 -> leave-one-out baselines (0+0)/2 = 0, (1+0)/2 = 0.5, 0.5 -> 1, -0.5, -0.5
    # group 1: scores 2, 6 -> baselines 6, 2 -> -4, 4; group 2: alone (4) -> baseline 0 -> 4
    out, mask = run("rloo", [1, 2, 0, 0, 6, 4], [1, 1, 2, 1, 3, 2], [0, 1, 0, 0, 1, 2])
    assert per_sequence(out, mask) == pytest.approx([1, -4, -0.5, -0.5, 4, 4], rel=1e-12)


def test_opo_hand_values():
    # group 0: (s=1, 1 token), (s=0, 3 tokens) -> b = (1*1 + 3*0) / 4 = 0.25 -> 0.75, -0.25
    # group 1: (s=2, 1 token), (s=4, 3 tokens) -> b = (2 + 12) / 4 = 3.5 (the plain mean would be 3) -> -1.5, 0.5
    # group 2: alone (s=2) -> b = 0 -> 2; group 3: 1, 1 -> zero variance -> 0
    out, mask = run("opo", [1, 0, 2, 4, 2, 1, 1], [1, 3, 1, 3, 2, 2, 4], [0, 0, 1, 1, 2, 3, 3])
    assert per_sequence(out, mask) == pytest.approx([0.75, -0.25, -1.5, 0.5, 2, 0, 0], rel=1e-12)
    assert out.zero_variance.tolist() == [False] * 5 + [True, True]


def test_gpg_hand_values():
    # 5 samples, 4 with a non-zero score -> alpha = 5/4; F_norm = 2
    # group 0: 1, 0 -> mean 0.5 -> ±0.5 * 1.25 / 2 = ±0.3125; group 1: 1, 1 -> 0; alone 3 -> 3 * 1.25 / 2 = 1.875
    out, mask = run("gpg", [1, 0, 1, 1, 3], [1, 2, 3, 4, 1], [0, 0, 1, 1, 2], gpg_f_norm=2.0)
    assert per_sequence(out, mask) == pytest.approx([0.3125, -0.3125, 0, 0, 1.875], rel=1e-12)
    # all scores zero: alpha = 4 / max(1, 0) = 4, advantages 0 (no division by zero)
    out, _ = run("gpg", [0, 0, 0, 0], [1, 2, 3, 4], [0, 0, 1, 1])
    assert torch.equal(out.advantages, torch.zeros_like(out.advantages))


def test_grpo_passk_hand_values():
    # group 0 at positions 0, 2, 4: scores 3, 1, 2 -> only position 0 gets 3 - 2 = 1; std of [3, 1, 2] = 1
    # group 1 at positions 1, 3: scores 0, 4 -> only position 3 gets 4 - 0 = 4; std sqrt(8) = 2.82843
    # group 2: 5, 5 -> the first best gets 5 - 5 = 0, so all 0
    args = ([3, 0, 1, 4, 2, 5, 5], [1, 2, 3, 4, 1, 2, 3], [0, 1, 0, 1, 0, 2, 2])
    out, mask = run("grpo_passk", *args, scale="none")
    assert per_sequence(out, mask) == [1, 0, 0, 4, 0, 0, 0]
    out, mask = run("grpo_passk", *args)
    assert per_sequence(out, mask) == pytest.approx([1 / (1 + EPS), 0, 0, 4 / (math.sqrt(8) + EPS), 0, 0, 0])
    # scale=batch: the unbiased std of all seven scores: squares 80 - 7 * (20/7)^2 = 160/7, over 6
    out, mask = run("grpo_passk", *args, scale="batch")
    batch_std = math.sqrt(160 / 7 / 6)
    assert per_sequence(out, mask) == pytest.approx([1 / (batch_std + EPS), 0, 0, 4 / (batch_std + EPS), 0, 0, 0])
    with pytest.raises(ValueError, match="grpo_passk needs at least 2 responses per prompt"):
        run("grpo_passk", [1, 0, 2], [1, 1, 1], [0, 0, 1])


def test_reinforce_pp_baseline_hand_values():
    # group 0: scores 1 (1 token), 0 (2 tokens) -> centred 0.5, -0.5; group 5: alone, 2 -> mean 0 -> 2
    # valid tokens [0.5, -0.5, -0.5, 2]: mean 0.375, squares 0.015625 + 2 * 0.765625 + 2.640625 = 4.1875,
    # std sqrt(4.1875 / 3) -> whitened (v - 0.375) / (std + 1e-8)
    out, mask = run("reinforce_pp_baseline", [1, 0, 2], [1, 2, 1], [0, 0, 5])
    std = math.sqrt(4.1875 / 3) + 1e-8
    expected = [(v - 0.375) / std for v in (0.5, -0.5, -0.5, 2)]
    assert out.advantages[mask].tolist() == pytest.approx(expected, rel=1e-12)
    assert (out.advantages[~mask] == 0).all() and out.returns is out.advantages
    assert out.zero_variance.tolist() == [False, False, False]


# ------------------------------------------------------------------ token-level returns: hand-derived values
def test_reinforce_pp_hand_values():
    rewards = torch.tensor([[1.0, 0.0, 2.0, 5.0], [1.0, 7.0, 2.0, 4.0]], dtype=F64)
    contiguous = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    # gamma 1 (reverse cumsum): row 0 -> [3, 2, 2, 0] (the masked 5 is ignored); row 1 -> [8, 7, 0, 0]
    out = compute_advantages("reinforce_pp", AdvantageInput(rewards, contiguous))
    assert out.returns.tolist() == [[3, 2, 2, 0], [8, 7, 0, 0]]
    # gamma 0.5 (blocked scan): row 0 -> t2 = 2, t1 = 0 + 0.5*2 = 1, t0 = 1 + 0.5*1 = 1.5; row 1 -> [4.5, 7]
    half = AdvantageOptions(gamma=0.5)
    out = compute_advantages("reinforce_pp", AdvantageInput(rewards, contiguous, options=half))
    assert out.returns.tolist() == [[1.5, 1, 2, 0], [4.5, 7, 0, 0]]
    # valid returns [1.5, 1, 2, 4.5, 7]: mean 3.2; squares 2.89 + 4.84 + 1.44 + 1.69 + 14.44 = 25.3, / 4
    std = math.sqrt(25.3 / 4) + 1e-8
    expected = [(v - 3.2) / std for v in (1.5, 1, 2, 4.5, 7)]
    assert out.advantages[contiguous.bool()].tolist() == pytest.approx(expected, rel=1e-12)
    assert (out.advantages[contiguous == 0] == 0).all()
    # a hole is skipped, not a restart: row 1 with mask [1, 0, 1, 1], gamma 0.5 -> t3 = 4, t2 = 2 + 2 = 4,
    # t1 = 0 (masked, carries 4), t0 = 1 + 0.5 * 4 = 3
    holes = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 1]])
    out = compute_advantages("reinforce_pp", AdvantageInput(rewards, holes, options=half))
    assert out.returns.tolist() == [[1.5, 1, 2, 0], [3, 0, 4, 4]]


def test_remax_hand_values():
    rewards = torch.tensor([[1.0, 0.0, 2.0, 5.0], [0.0, 1.0, 0.0, 0.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    baseline = torch.tensor([1.0, 2.5], dtype=F64)
    # gamma 1: G = [3, 2, 2, 0] and [1, 1, 0, 0]; minus b = 1 and 2.5 on valid tokens
    out = compute_advantages("remax", AdvantageInput(rewards, mask, baseline_scores=baseline))
    assert out.returns.tolist() == [[3, 2, 2, 0], [1, 1, 0, 0]]
    assert out.advantages.tolist() == [[2, 1, 1, 0], [-1.5, -1.5, 0, 0]]
    # gamma 0.5: G row 0 = [1.5, 1, 2, 0] -> A = [0.5, 0, 1, 0]
    out = compute_advantages("remax", AdvantageInput(rewards, mask, baseline_scores=baseline,
                                                     options=AdvantageOptions(gamma=0.5)))
    assert out.advantages[0].tolist() == [0.5, 0, 1, 0]


def whitened(values):
    mean, std = statistics.fmean(values), statistics.stdev(values)
    return [(v - mean) / (std + 1e-8) for v in values]


def test_gae_hand_values_contiguous():
    # r = [0, 1], V = [0.5, 0.2], gamma 0.9, lam 0.8 (the masked third token has V 9, r 3: ignored)
    # t1: delta = 1 + 0.9*0 - 0.2 = 0.8, A = 0.8; t0: delta = 0 + 0.9*0.2 - 0.5 = -0.32, A = -0.32 + 0.72*0.8 = 0.256
    rewards = torch.tensor([[0.0, 1.0, 3.0]], dtype=F64)
    values = torch.tensor([[0.5, 0.2, 9.0]], dtype=F64)
    mask = torch.tensor([[1, 1, 0]])
    out = compute_advantages("gae", AdvantageInput(rewards, mask, values=values,
                                                   options=AdvantageOptions(gamma=0.9, lam=0.8)))
    assert out.returns[0].tolist() == pytest.approx([0.256 + 0.5, 0.8 + 0.2, 0.0], rel=1e-12)
    assert out.advantages[0].tolist() == pytest.approx(whitened([0.256, 0.8]) + [0.0], rel=1e-12)


def test_gae_hand_values_with_a_hole():
    # mask [1, 1, 0, 1]: the masked token (r 7, V 9) is skipped, not a step; gamma 0.9, lam 0.8
    # t3 (last valid): delta = 2 + 0 - 0.4 = 1.6, A = 1.6
    # t1 (next valid is t3): delta = 1 + 0.9*0.4 - 0.2 = 1.16, A = 1.16 + 0.72*1.6 = 2.312
    # t0: delta = 0 + 0.9*0.2 - 0.5 = -0.32, A = -0.32 + 0.72*2.312 = 1.34464
    rewards = torch.tensor([[0.0, 1.0, 7.0, 2.0]], dtype=F64)
    values = torch.tensor([[0.5, 0.2, 9.0, 0.4]], dtype=F64)
    mask = torch.tensor([[1, 1, 0, 1]])
    out = compute_advantages("gae", AdvantageInput(rewards, mask, values=values,
                                                   options=AdvantageOptions(gamma=0.9, lam=0.8)))
    assert out.returns[0].tolist() == pytest.approx([1.34464 + 0.5, 2.312 + 0.2, 0.0, 1.6 + 0.4], rel=1e-12)
    a = whitened([1.34464, 2.312, 1.6])
    assert out.advantages[0].tolist() == pytest.approx([a[0], a[1], 0.0, a[2]], rel=1e-12)


# ------------------------------------------------------------------ independent per-sample loop formulations
def random_batch(seed, batch=40, length=2 * SCAN_BLOCK + 5, groups=12, holes=False):
    """Ragged masks (left offsets, random lengths, one empty row), optional holes, garbage rewards on masked
    tokens, random group ids (so some groups have one member) and one forced zero-variance group."""
    gen = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, 4, (batch,), generator=gen)
    starts[1:4] = 0
    lengths = torch.randint(1, length - 3, (batch,), generator=gen)
    pos = torch.arange(length)[None]
    mask = (pos >= starts[:, None]) & (pos < (starts + lengths)[:, None])
    if holes:
        mask &= torch.rand(batch, length, generator=gen) > 0.25
    mask[0] = False
    mask[1:4, 0] = True
    rewards = torch.randn(batch, length, dtype=F64, generator=gen)
    rewards[1:4] = 0.0  # rows 1-3: one group, the same single rewarded token -> equal scores
    rewards[1:4, 0] = 0.7
    ids = torch.randint(0, groups, (batch,), generator=gen)
    ids[1:4] = groups + 1
    values = torch.randn(batch, length, dtype=F64, generator=gen)
    # both code paths of the token-level estimators must be exercised: one valid run per row, or holes
    runs = [sum(1 for t in range(length) if mask[i, t] and (t == 0 or not mask[i, t - 1])) for i in range(batch)]
    assert (max(runs) > 1) == holes
    return rewards, mask, ids, values


def loop_scores(rewards, mask, ids):
    scores = [math.fsum(r * m for r, m in zip(row, mrow)) for row, mrow in zip(rewards.tolist(), mask.tolist())]
    groups = defaultdict(list)
    for s, g in zip(scores, ids.tolist()):
        groups[g].append(s)
    return scores, groups


def loop_grpo(scores, groups, ids, scale):
    batch_std = statistics.stdev(scores)
    out = []
    for s, g in zip(scores, ids.tolist()):
        xs = groups[g]
        mean, std = (0.0, 1.0) if len(xs) == 1 else (statistics.fmean(xs), statistics.stdev(xs))
        denominator = {"group": std + EPS, "batch": batch_std + EPS, "none": 1.0}[scale]
        out.append((s - mean) / denominator)
    return out


def loop_rloo(scores, groups, ids):
    out = []
    for s, g in zip(scores, ids.tolist()):
        others = list(groups[g])
        others.remove(s)
        out.append(s - (math.fsum(others) / len(others) if others else 0.0))
    return out


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("name, scale", [("grpo", "group"), ("grpo", "batch"), ("grpo", "none"), ("rloo", "group")])
def test_grpo_and_rloo_match_per_sample_loops(name, scale, seed):
    rewards, mask, ids, _ = random_batch(seed)
    scores, groups = loop_scores(rewards, mask, ids)
    assert any(len(xs) == 1 for xs in groups.values()), "the batch should contain a group of one"
    expected = loop_rloo(scores, groups, ids) if name == "rloo" else loop_grpo(scores, groups, ids, scale)
    out = compute_advantages(name, AdvantageInput(rewards, mask, ids, options=AdvantageOptions(scale=scale)))
    torch.testing.assert_close(out.advantages, torch.tensor(expected, dtype=F64)[:, None] * mask)


def loop_whiten(rows, mask):
    flat = [v for row, mrow in zip(rows, mask.tolist()) for v, m in zip(row, mrow) if m]
    mean, std = statistics.fmean(flat), statistics.stdev(flat)
    return [
        [(v - mean) / (std + 1e-8) if m else 0.0 for v, m in zip(row, mrow)]
        for row, mrow in zip(rows, mask.tolist())
    ]


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("holes", [False, True])
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_reinforce_pp_matches_per_sample_loop(gamma, holes, seed):
    rewards, mask, _, _ = random_batch(seed, holes=holes)
    returns = []
    for row, mrow in zip(rewards.tolist(), mask.tolist()):
        g, out = 0.0, [0.0] * len(row)
        for t in reversed(range(len(row))):
            if mrow[t]:  # a masked token inside the row is skipped: the return carries across it
                g = row[t] + gamma * g
            out[t] = g if mrow[t] else 0.0
        returns.append(out)
    res = compute_advantages("reinforce_pp", AdvantageInput(rewards, mask, options=AdvantageOptions(gamma=gamma)))
    torch.testing.assert_close(res.returns, torch.tensor(returns, dtype=F64))
    torch.testing.assert_close(res.advantages, torch.tensor(loop_whiten(returns, mask), dtype=F64))


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("holes", [False, True])
@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.95, 0.9), (0.9, 0.0)])
def test_gae_matches_per_sample_loop_over_valid_tokens(gamma, lam, holes, seed):
    rewards, mask, _, values = random_batch(seed, holes=holes)
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


# ------------------------------------------------------------------ every estimator: shapes, masking, inputs
def full_input(dtype=F64, **options):
    rewards, mask, _, values = random_batch(5, batch=24, length=11)
    ids = torch.randperm(24, generator=torch.Generator().manual_seed(0)) // 4  # groups of 4, interleaved
    baseline = torch.linspace(-1, 1, 24, dtype=F64)
    return AdvantageInput(rewards.to(dtype), mask, ids, values=values.to(dtype), baseline_scores=baseline.to(dtype),
                          options=AdvantageOptions(gamma=0.9, lam=0.95, **options))


@pytest.mark.parametrize("name", BUILTIN)
def test_every_estimator_shapes_dtype_and_masking(name):
    inp = full_input()
    out = compute_advantages(name, inp)
    assert out.advantages.shape == out.returns.shape == inp.token_level_rewards.shape
    assert out.advantages.dtype == out.returns.dtype == F64
    assert (out.advantages[~inp.response_mask] == 0).all() and torch.isfinite(out.advantages).all()
    assert out.advantages.abs().sum() > 0
    if name in GROUP_ESTIMATORS:
        assert out.zero_variance.shape == (24,) and out.zero_variance.dtype == torch.bool
    else:
        assert out.zero_variance is None
    # float32 rewards with a bool mask give the float64 result to float32 precision
    out32 = compute_advantages(name, full_input(torch.float32))
    assert out32.advantages.dtype == torch.float32
    torch.testing.assert_close(out32.advantages, out.advantages.float(), rtol=1e-4, atol=1e-5)


def test_builtin_names_and_requirements():
    assert set(BUILTIN) <= set(ADVANTAGE_ESTIMATORS.names())
    for name in BUILTIN:
        spec = estimator_spec(name)
        assert spec.min_group_size == (2 if name in GROUP_ESTIMATORS else 1), name
        assert spec.needs_values == (name == "gae") and spec.needs_baseline == (name == "remax"), name
        assert spec.uses_reward_terms == (name == "gdpo"), name


@pytest.mark.parametrize(
    "name, field, shape",
    [(n, "group_ids", "[batch]") for n in GROUP_ESTIMATORS]
    + [("gae", "values", "[batch, response_len]"), ("remax", "baseline_scores", "[batch]")],
)
def test_missing_inputs_name_the_estimator_and_field(name, field, shape):
    inp = full_input()
    setattr(inp, field, None)
    message = f"advantage estimator '{name}' needs AdvantageInput.{field}, a {shape}"
    with pytest.raises(ValueError, match=re.escape(message)):
        compute_advantages(name, inp)


@pytest.mark.parametrize(
    "name, field, bad, message",
    [
        (
            "grpo", "group_ids", torch.zeros(23, dtype=torch.long),
            "AdvantageInput.group_ids has shape (23,); expected [batch] = (24,)",
        ),
        (
            "gae", "values", torch.zeros(24, 10),
            "AdvantageInput.values has shape (24, 10); expected [batch, response_len] = (24, 11)",
        ),
        (
            "remax", "baseline_scores", torch.zeros(24, 1),
            "AdvantageInput.baseline_scores has shape (24, 1); expected [batch] = (24,)",
        ),
        (
            "reinforce_pp", "response_mask", torch.ones(24, 12, dtype=torch.bool),
            "must both be [batch, response_len]; got (24, 11) and (24, 12)",
        ),
        ("rloo", "token_level_rewards", torch.zeros(24), "must both be [batch, response_len]; got (24,) and (24, 11)"),
    ],
)
def test_shape_mismatches_raise_with_shapes(name, field, bad, message):
    inp = full_input()
    setattr(inp, field, bad)
    with pytest.raises(ValueError, match=re.escape(message)):
        compute_advantages(name, inp)


# ------------------------------------------------------------------ registry: user estimators, unknown names
def test_user_estimator_is_selectable_by_name():
    def constant_half(inp: AdvantageInput) -> AdvantageOutput:
        adv = inp.response_mask.to(inp.token_level_rewards.dtype) * 0.5
        return AdvantageOutput(advantages=adv, returns=adv)

    rewards, mask = outcome([1.0, 0.0], [1, 2])
    with ADVANTAGE_ESTIMATORS.temporary("constant_half", constant_half):
        assert "constant_half" in ADVANTAGE_ESTIMATORS.names()
        assert get_advantage_estimator("constant_half") is constant_half
        assert compute_advantages("constant_half", AdvantageInput(rewards, mask)).advantages.sum() == 1.5
    assert "constant_half" not in ADVANTAGE_ESTIMATORS
    with pytest.raises(UnknownNameError):
        get_advantage_estimator("constant_half")


def test_builtin_name_cannot_be_silently_replaced():
    with ADVANTAGE_ESTIMATORS.isolated():
        with pytest.raises(DuplicateNameError, match="'grpo' is already registered"):
            ADVANTAGE_ESTIMATORS.add("grpo", lambda inp: None)
    assert get_advantage_estimator("grpo").__name__ == "grpo"


def test_unknown_name_suggests_the_closest_and_lists_known_names():
    with pytest.raises(UnknownNameError) as info:
        compute_advantages("grpoo", AdvantageInput(*outcome([1.0], [1])))
    message = str(info.value)
    assert "unknown advantage estimator 'grpoo'" in message
    assert "did you mean 'grpo'?" in message
    assert message.endswith("known: " + ", ".join(ADVANTAGE_ESTIMATORS.names()))
    assert all(name in message for name in BUILTIN)
