"""The README's Python snippets run as printed and do what the text around them says."""

import re
from pathlib import Path

import torch

from rlplat.algorithms import ADVANTAGE_ESTIMATORS, AdvantageInput, estimator_spec
from rlplat.reward import REWARD_FUNCTIONS

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def snippet(first_line: str) -> str:
    (code,) = [b for b in re.findall(r"^```python\n(.*?)^```", README, flags=re.DOTALL | re.MULTILINE)
               if b.startswith(first_line)]
    return code


def test_the_reward_example_reuses_a_builtin_scorer():
    namespace: dict = {}
    exec(snippet("# my_reward.py"), namespace)
    good = namespace["compute_score"]("math", r"so \boxed{4}", "4")
    bad = namespace["compute_score"]("math", r"\boxed{5}", "4")
    assert good["acc"] == 1.0 and bad["acc"] == 0.0
    assert good["score"] == 1.0 - 0.001 * len(r"so \boxed{4}")
    assert namespace["math_boxed"] is REWARD_FUNCTIONS.get("math")  # the scorer reward.functions=[math] uses


def test_the_estimator_example_uses_each_responses_group():
    exec(snippet("# my_estimators.py"), {})
    try:
        fn = ADVANTAGE_ESTIMATORS.get("group_mean_baseline")
        assert estimator_spec("group_mean_baseline").min_group_size == 2
        rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0], [0.0, 3.0], [0.0, 1.0]])  # scores 1, 0 | 3, 1
        out = fn(AdvantageInput(rewards, torch.ones(4, 2), group_ids=torch.tensor([0, 0, 7, 7])))
        assert out.advantages[:, 0].tolist() == [0.5, -0.5, 1.0, -1.0]
    finally:
        ADVANTAGE_ESTIMATORS._entries.pop("group_mean_baseline", None)
