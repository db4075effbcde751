import math

import pytest

from rlplat.engines.optim import lr_lambda


def test_warmup_then_constant_linear_cosine():
    constant = lr_lambda("constant", 4, 20, 0.0)
    assert [constant(s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]  # first step already moves
    linear = lr_lambda("linear", 0, 10, 0.1)
    assert [linear(s) for s in (0, 5, 10, 15)] == pytest.approx([1.0, 0.55, 0.1, 0.1])
    cosine = lr_lambda("cosine", 2, 12, 0.0)
    assert cosine(2) == 1.0 and cosine(7) == pytest.approx(0.5) and cosine(12) == pytest.approx(0.0)
    assert cosine(4) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.2)))
