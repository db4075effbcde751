import pytest
import torch

from rlplat.algorithms.aggregation import (
    AGGREGATION_MODES,
    LossDenominators,
    aggregate_loss,
    get_aggregation,
)
from rlplat.registry import UnknownNameError

MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]

# loss rows and masks chosen so every mode gives a different number:
#   row 0: tokens 1, 2 valid (3 masked)      -> token sum 3,  token mean 1.5
#   row 1: token 4 valid                     -> token sum 4,  token mean 4
#   row 2: nothing valid (does not count as a sequence)
LOSS = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], dtype=torch.float64)
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])


def test_registered_modes():
    assert set(MODES) <= set(AGGREGATION_MODES.names())


def test_denominators_from_mask():
    d = LossDenominators.from_mask(MASK)
    assert (d.num_tokens, d.num_seqs) == (3.0, 2.0)
    assert d + d == LossDenominators(6.0, 4.0)


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", (3 + 4) / 3),  # 7 / 3 valid tokens
        ("token-sum", 3 + 4),  # no normaliser
        ("seq-mean-token-sum", (3 + 4) / 2),  # 7 / 2 sequences with a valid token
        ("seq-mean-token-mean", (1.5 + 4) / 2),  # per-sequence means 1.5 and 4
        # Dr. GRPO: 1/N over the 2 sequences of each token sum / C, C = response length 3
        ("seq-mean-token-sum-norm", (3 + 4) / (2 * 3)),
    ],
)
def test_hand_values(mode, expected):
    assert aggregate_loss(LOSS, MASK, mode).item() == pytest.approx(expected)


def test_sum_norm_uses_loss_scale_factor():
    # (3 + 4) / (2 sequences x C = 14)
    assert aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=14).item() == 0.25
    with pytest.raises(ValueError, match="loss_scale_factor"):
        aggregate_loss(LOSS, MASK, "seq-mean-token-sum-norm", loss_scale_factor=0)


def test_explicit_denominators_override_local_counts():
    # A micro-batch of the first row only, inside a mini-batch of 10 tokens / 4 sequences.
    d = LossDenominators(num_tokens=10, num_seqs=4)
    assert aggregate_loss(LOSS[:1], MASK[:1], "token-mean", d).item() == pytest.approx(3 / 10)
    assert aggregate_loss(LOSS[:1], MASK[:1], "seq-mean-token-mean", d).item() == pytest.approx(1.5 / 4)


@pytest.mark.parametrize("mode", MODES)
def test_all_masked_is_zero_not_nan(mode):
    out = aggregate_loss(LOSS, torch.zeros_like(MASK), mode)
    assert out.item() == 0.0


def test_shape_mismatch_and_unknown_mode():
    with pytest.raises(ValueError, match="must match"):
        aggregate_loss(LOSS, MASK[:, :2], "token-mean")
    with pytest.raises(UnknownNameError, match="did you mean 'token-mean'"):
        get_aggregation("token_mean")


def _random_problem(gen, batch, length):
    """A differentiable per-token loss of parameters theta, with ragged masks (some rows empty)."""
    theta = torch.randn(4, dtype=torch.float64, generator=gen, requires_grad=True)
    features = torch.randn(batch, length, 4, dtype=torch.float64, generator=gen)
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    mask = torch.arange(length)[None, :] < lengths[:, None]
    return theta, features, mask


def _per_token_loss(theta, features):
    return torch.tanh(features @ theta) ** 2 + features[..., 0] * theta[1]


def _random_partition(gen, n, max_parts):
    """Split range(n) into 1..max_parts contiguous, possibly unequal, non-empty pieces."""
    parts = int(torch.randint(1, min(max_parts, n) + 1, (1,), generator=gen))
    cuts = sorted(torch.randperm(n - 1, generator=gen)[: parts - 1].add(1).tolist())
    bounds = [0, *cuts, n]
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(8))
def test_micro_batches_and_ranks_sum_to_full_batch_gradient(mode, seed):
    gen = torch.Generator().manual_seed(seed)
    batch, length = 13, 7
    theta, features, mask = _random_problem(gen, batch, length)
    scale = 5.0 if seed % 2 else None  # exercise the explicit constant of seq-mean-token-sum-norm

    full = aggregate_loss(_per_token_loss(theta, features), mask, mode, loss_scale_factor=scale)
    (full_grad,) = torch.autograd.grad(full, theta)

    # Simulated data-parallel ranks, each split into micro-batches; the denominators are the global
    # counts (what an all-reduce of the per-rank counts gives), gradients summed over everything.
    denominators = LossDenominators.from_mask(mask)
    summed = torch.zeros_like(theta)
    total_loss = 0.0
    for rank in _random_partition(gen, batch, max_parts=3):
        rank_idx = torch.arange(batch)[rank]
        for micro in _random_partition(gen, len(rank_idx), max_parts=4):
            idx = rank_idx[micro]
            loss = aggregate_loss(
                _per_token_loss(theta, features[idx]), mask[idx], mode, denominators, scale
            )
            summed += torch.autograd.grad(loss, theta)[0]
            total_loss += loss.item()

    torch.testing.assert_close(summed, full_grad, atol=1e-6, rtol=0)
    assert total_loss == pytest.approx(full.item(), abs=1e-9)
