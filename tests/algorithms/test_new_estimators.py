"""gdpo and the optimal token baselines against hand-computed values (docs/algorithms.md)."""

import math

import pytest
import torch

from rlplat.algorithms import AdvantageInput, AdvantageOptions, compute_advantages, estimator_spec

F64 = torch.float64


def flat(t):
    return t.flatten().tolist()


# ---------------------------------------------------------------------------- gdpo
# Two prompts x 2 responses, one token each; terms: correctness c1 and format c2, weights [1, 0.5].
IDS = torch.tensor([0, 0, 1, 1])
C = torch.tensor([[1.0, 1.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]], dtype=F64)
ONE_TOKEN = torch.ones(4, 1)


def test_gdpo_normalises_each_term_in_its_group_then_whitens():
    # c1: group 0 = [1, 0] -> ±0.5 / std(√0.5) = ±√0.5; group 1 = [1, 1] -> 0.
    # c2: group 0 -> 0;  group 1 = [0, 1] -> ∓√0.5.  Σ w_k A_k = [a, −a, −b, b], a = √0.5, b = √0.5 / 2
    # Whitening over 4 tokens: mean 0, unbiased var = (2a² + 2b²) / 3 = 1.25 / 3.
    rewards = (C @ torch.tensor([1.0, 0.5], dtype=F64)).unsqueeze(-1)  # the weighted score, unused by gdpo
    inp = AdvantageInput(rewards, ONE_TOKEN, IDS, reward_components=C,
                         reward_weights=torch.tensor([1.0, 0.5], dtype=F64))
    out = compute_advantages("gdpo", inp)
    a, b = math.sqrt(0.5), math.sqrt(0.5) / 2
    std = math.sqrt(1.25 / 3) + 1e-8
    assert flat(out.advantages) == pytest.approx([a / std, -a / std, -b / std, b / std], rel=1e-5)
    assert out.zero_variance.tolist() == [False] * 4
    # GRPO on the weighted sum [1.5, 0.5, 0.5, 1.5] collapses both groups to the same ±0.707: gdpo keeps
    # the correctness gap twice as large as the format gap.
    grpo = compute_advantages("grpo", AdvantageInput(rewards, ONE_TOKEN, IDS))
    assert flat(grpo.advantages) == pytest.approx([a, -a, -a, a], rel=1e-5)


def test_gdpo_without_components_is_grpo_then_batch_whitening():
    # scores [1, 0, 1, 1] over response length 2 (both tokens valid): grpo -> [√0.5, −√0.5, 0, 0] per token;
    # whitened over 8 tokens: mean 0, var = 4 x 0.5 / 7 = 2/7
    scores = torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=F64)
    rewards = torch.stack([torch.zeros(4, dtype=F64), scores], dim=-1)
    out = compute_advantages("gdpo", AdvantageInput(rewards, torch.ones(4, 2), IDS))
    a = math.sqrt(0.5) / (math.sqrt(2 / 7) + 1e-8)
    assert flat(out.advantages) == pytest.approx([a, a, -a, -a, 0, 0, 0, 0], rel=1e-5)
    assert out.zero_variance.tolist() == [False, False, True, True]


def test_gdpo_shape_errors():
    with pytest.raises(ValueError, match=r"reward_weights has shape \(3,\); expected \[num_rewards\] = \(2,\)"):
        compute_advantages("gdpo", AdvantageInput(C[:, :1], ONE_TOKEN, IDS, reward_components=C,
                                                  reward_weights=torch.ones(3, dtype=F64)))
    with pytest.raises(ValueError, match="reward_components has shape"):
        compute_advantages("gdpo", AdvantageInput(C[:, :1], ONE_TOKEN, IDS, reward_components=C[:3]))


# ---------------------------------------------------------------------------- optimal token baselines
def otb_input(rewards, mask, p, sum_pi_sq, ids=(0, 0)):
    t = lambda x: torch.tensor(x, dtype=F64)  # noqa: E731
    return AdvantageInput(t(rewards), torch.tensor(mask), torch.tensor(ids), old_log_probs=t(p).log(),
                          sum_pi_squared=t(sum_pi_sq))


def test_optimal_token_baseline_hand_values():
    # w = 1 − 2p + Σπ²: row 0 [0.5, 0.5], row 1 [0.5, 0] -> W (cumulative) row 0 [0.5, 1], row 1 [0.5, 0.5]
    # G: row 0 [1, 1] (reward at the end), row 1 [0, 0]
    # B_0 = (1·0.5 + 0·0.5) / 1 = 0.5;  B_1 = (1·1 + 0·0.5) / 1.5 = 2/3   (a group mean would give 0.5 twice)
    inp = otb_input([[0, 1], [0, 0]], [[1, 1], [1, 1]], [[0.5, 0.5], [0.5, 1.0]], [[0.5, 0.5], [0.5, 1.0]])
    out = compute_advantages("optimal_token_baseline", inp)
    assert flat(out.advantages) == pytest.approx([0.5, 1 / 3, -0.5, -2 / 3], rel=1e-7)
    assert flat(out.returns) == [1, 1, 0, 0]


def test_tir_optimal_token_baseline_squeezes_out_observation_tokens():
    # The same numbers as above, but row 0's second valid token sits after a masked token (position 2):
    # tir compares valid token k with valid token k -> the same advantages, put back in place.
    inp = otb_input([[0, 9, 1], [0, 0, 0]], [[1, 0, 1], [1, 1, 0]], [[0.5, 0.1, 0.5], [0.5, 1.0, 0.3]],
                    [[0.5, 0.7, 0.5], [0.5, 1.0, 0.2]])
    tir = compute_advantages("tir_optimal_token_baseline", inp)
    assert flat(tir.advantages) == pytest.approx([0.5, 0, 1 / 3, -0.5, -2 / 3, 0], rel=1e-7)
    # the positional variant compares raw positions: at t = 1 and t = 2 only one response is valid, so its
    # baseline is its own return (advantage 0); only t = 0 (B = 0.5) carries signal.
    plain = compute_advantages("optimal_token_baseline", inp)
    assert flat(plain.advantages) == pytest.approx([0.5, 0, 0, -0.5, 0, 0], abs=1e-7)


@pytest.mark.parametrize("name", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_zero_tail_gives_the_lone_longest_response_its_return(name):
    # row 0 has 3 valid tokens, row 1 one: p = Σπ² = 0.5 -> w = 0.5. G row 0 [1, 1, 1], row 1 [1].
    # t0: B = (1·0.5 + 1·0.5) / 1 = 1 -> A = 0 for both. Beyond the second-longest (t >= 1) row 0 is alone:
    # the zero tail (the default, as verl's handle_zero_tail) sets B = 0 there, so A = G = 1; without it
    # (algorithm.otb_zero_tail=false) B = G there and A = 0.
    inp = otb_input([[0, 0, 1], [1, 0, 0]], [[1, 1, 1], [1, 0, 0]], [[0.5] * 3] * 2, [[0.5] * 3] * 2)
    assert flat(compute_advantages(name, inp).advantages) == pytest.approx([0, 1, 1, 0, 0, 0], abs=1e-7)
    inp.options = AdvantageOptions(otb_zero_tail=False)
    assert flat(compute_advantages(name, inp).advantages) == pytest.approx([0] * 6, abs=1e-7)
    # two responses share the longest length: nobody is alone, no tail
    tied = otb_input([[0, 0, 1], [0, 0, 1]], [[1, 1, 1], [1, 1, 1]], [[0.5] * 3] * 2, [[0.5] * 3] * 2)
    assert flat(compute_advantages(name, tied).advantages) == pytest.approx([0] * 6, abs=1e-7)


@pytest.mark.parametrize("name", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_rollout_importance_weights_scale_the_variance_term_by_their_square(name):
    # As the hand values above, with ρ̄ = [1, 2] on row 0: w row 0 = [0.5, 0.5 · 4] -> W row 0 [0.5, 2.5],
    # row 1 [0.5, 0.5]. B_0 = 0.5, B_1 = (1·2.5 + 0·0.5) / 3 = 5/6.
    inp = otb_input([[0, 1], [0, 0]], [[1, 1], [1, 1]], [[0.5, 0.5], [0.5, 1.0]], [[0.5, 0.5], [0.5, 1.0]])
    inp.importance_weights = torch.tensor([[1.0, 2.0], [1.0, 1.0]], dtype=F64)
    out = compute_advantages(name, inp)
    assert flat(out.advantages) == pytest.approx([0.5, 1 / 6, -0.5, -5 / 6], rel=1e-7)
    inp.importance_weights = torch.ones(2, 2, dtype=F64)  # weights of 1 change nothing
    assert flat(compute_advantages(name, inp).advantages) == pytest.approx([0.5, 1 / 3, -0.5, -2 / 3], rel=1e-7)


def test_optimal_token_baselines_group_of_one_and_requirements():
    inp = otb_input([[0, 2]], [[1, 1]], [[0.5, 0.5]], [[0.5, 0.5]], ids=(0,))
    for name in ("optimal_token_baseline", "tir_optimal_token_baseline"):
        assert flat(compute_advantages(name, inp).advantages) == [2, 2]  # baseline 0: A = G
        assert estimator_spec(name).needs_sum_pi_squared
        with pytest.raises(ValueError, match="needs AdvantageInput.sum_pi_squared"):
            compute_advantages(name, AdvantageInput(inp.token_level_rewards, inp.response_mask, inp.group_ids,
                                                    old_log_probs=inp.old_log_probs))


@pytest.mark.parametrize("zero_tail", [True, False])
@pytest.mark.parametrize("weighted", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_optimal_token_baseline_matches_a_per_group_loop(seed, weighted, zero_tail):
    """Against a loop written from verl's description: W scaled by ρ̄², and the zero tail of a group whose
    longest response is unique starting at the second-longest length."""
    g = torch.Generator().manual_seed(seed)
    batch, length = 12, 7
    lengths = torch.randint(1, length + 1, (batch,), generator=g)
    mask = (torch.arange(length)[None] < lengths[:, None]).double()
    rewards = torch.randn(batch, length, generator=g, dtype=F64) * mask
    p, sum_sq = torch.rand(batch, length, generator=g, dtype=F64), torch.rand(batch, length, generator=g, dtype=F64)
    rho = torch.rand(batch, length, generator=g, dtype=F64) * 2 if weighted else None
    ids = torch.randint(0, 4, (batch,), generator=g)
    inp = AdvantageInput(rewards, mask, ids, old_log_probs=p.log(), sum_pi_squared=sum_sq, importance_weights=rho,
                         options=AdvantageOptions(otb_zero_tail=zero_tail))
    out = compute_advantages("optimal_token_baseline", inp)
    returns = rewards.flip(-1).cumsum(-1).flip(-1) * mask
    w = (1 - 2 * p + sum_sq) * (rho.square() if weighted else 1)
    cum = (w * mask).cumsum(-1)
    expected = torch.zeros(batch, length, dtype=F64)
    for gid in ids.unique().tolist():
        rows = (ids == gid).nonzero().flatten().tolist()
        ranked = sorted(int(lengths[i]) for i in rows)
        lone = [i for i in rows if int(lengths[i]) == ranked[-1]] if len(rows) > 1 and ranked[-1] > ranked[-2] else []
        for t in range(length):
            num = sum(returns[i, t] * cum[i, t] * mask[i, t] for i in rows)
            den = sum(cum[i, t] * mask[i, t] for i in rows)
            base = num / (den + 1e-8) if len(rows) > 1 else 0.0
            for i in rows:
                tail = zero_tail and i in lone and t >= ranked[-2]
                expected[i, t] = (returns[i, t] - (0.0 if tail else base)) * mask[i, t]
    torch.testing.assert_close(out.advantages, expected)
