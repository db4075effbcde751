"""Off-policy corrections (rlplat.algorithms.off_policy), each weight and mask computed by hand, token,
sequence and geometric level; the config's keys, the tis_cap alias and its errors."""

import math

import pytest
import torch

from rlplat.algorithms import OFF_POLICY_CORRECTIONS, OffPolicyInput
from rlplat.config import ConfigError, load_config

# two responses: log ρ_t = log π_old − log μ per token; the last token of the second is padding
OLD = torch.zeros(2, 3)
ROLLOUT = torch.tensor([[-1.0, 0.5, 2.0], [0.2, -0.3, 9.0]])  # log ρ = [1, -0.5, -2], [-0.2, 0.3, pad]
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
E = math.exp


def run(name, level="token", **thresholds):
    return OFF_POLICY_CORRECTIONS.get(name)(OffPolicyInput(OLD, ROLLOUT, MASK, level, **thresholds))


def weights(name, level="token", **thresholds):
    return run(name, level, **thresholds).weights * MASK


def test_tis_truncates_each_token_or_each_response():
    torch.testing.assert_close(weights("tis", cap=2.0), torch.tensor([[2.0, E(-0.5), E(-2)], [E(-0.2), E(0.3), 0]]))
    # sequence: ρ_seq = exp(1 - 0.5 - 2) = e^-1.5, exp(0.1); one weight for all of a response's tokens
    torch.testing.assert_close(weights("tis", "sequence", cap=1.05),
                               torch.tensor([[E(-1.5)] * 3, [1.05, 1.05, 0]]))
    # geometric: exp(mean log ρ) = exp(-0.5), exp(0.05)
    torch.testing.assert_close(weights("tis", "geometric", cap=2.0), torch.tensor([[E(-0.5)] * 3, [E(0.05)] * 2 + [0]]))
    metrics = run("tis", cap=2.0).metrics
    assert math.isclose(float(metrics["off_policy/ratio_high_frac"]), 1 / 5, rel_tol=1e-6)  # ρ = e > 2
    assert math.isclose(float(metrics["off_policy/weight_mean"]), (2 + E(-0.5) + E(-2) + E(-0.2) + E(0.3)) / 5,
                        rel_tol=1e-6)


def test_mis_and_icepop_zero_what_falls_outside_and_keep_the_rest_weighted():
    # [0.5, 2]: e (> 2) and e^-2 (< 0.5) are masked
    expected = torch.tensor([[0.0, E(-0.5), 0.0], [E(-0.2), E(0.3), 0]])
    torch.testing.assert_close(weights("mis", low=0.5, high=2.0), expected)
    torch.testing.assert_close(weights("icepop", low=0.5, high=2.0), expected)
    metrics = run("mis", low=0.5, high=2.0).metrics
    assert math.isclose(float(metrics["off_policy/masked_frac"]), 2 / 5, rel_tol=1e-6)
    assert math.isclose(float(metrics["off_policy/ratio_high_frac"]), 1 / 5, rel_tol=1e-6)
    assert math.isclose(float(metrics["off_policy/ratio_low_frac"]), 1 / 5, rel_tol=1e-6)
    # sequence: e^-1.5 = 0.22 under 0.5 masks the whole first response; exp(0.1) is kept
    torch.testing.assert_close(weights("mis", "sequence", low=0.5, high=2.0), torch.tensor([[0.0] * 3, [E(0.1)] * 2 + [0]]))
    with pytest.raises(ValueError, match="icepop masks tokens"):
        run("icepop", "sequence")


def test_mismatch_metrics_whatever_the_correction():
    metrics = run("none").metrics
    assert run("none").weights is None
    log_ratio = [1.0, -0.5, -2.0, -0.2, 0.3]
    assert math.isclose(float(metrics["rollout/log_prob_abs_diff"]), sum(map(abs, log_ratio)) / 5, rel_tol=1e-6)
    assert math.isclose(float(metrics["rollout/mismatch_kl"]), -sum(log_ratio) / 5, rel_tol=1e-6)  # log μ − log π_old
    assert math.isclose(float(metrics["rollout/mismatch_k3"]), sum(E(x) - x - 1 for x in log_ratio) / 5, rel_tol=1e-6)


def test_the_config_keys_the_alias_and_their_errors():
    algo = load_config(["algorithm.tis_cap=3.0"]).algorithm
    assert (algo.off_policy.correction, algo.off_policy.level, algo.off_policy.cap, algo.tis_cap) == ("tis", "token", 3.0, None)
    assert load_config([]).algorithm.off_policy.correction == "none"
    for overrides, message in [
        (["algorithm.tis_cap=3.0", "algorithm.off_policy.correction=mis"], "is the alias of algorithm.off_policy"),
        (["algorithm.off_policy.correction=clip"], "algorithm.off_policy.correction='clip' is not registered"),
        (["algorithm.off_policy.level=tokens"], "algorithm.off_policy.level='tokens' is not one of"),
        (["algorithm.off_policy.correction=icepop", "algorithm.off_policy.level=sequence"], "icepop masks tokens"),
        (["algorithm.off_policy.low=2.0"], "0 <= low < 1 < high"),
        (["algorithm.off_policy.cap=0"], "algorithm.off_policy.cap must be > 0"),
        (["algorithm.tis_cap=-1"], r"algorithm.tis_cap must be > 0 \(or null = off\), got -1"),
    ]:
        with pytest.raises(ConfigError, match=message):
            load_config(overrides)
