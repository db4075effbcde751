"""The ``math`` scorer on a hand-labelled corpus of answers in the forms models write (math_corpus.py).

Targets (issue: rewards): at least 97% of the right answers accepted, no wrong answer accepted. The
accuracy of each category is printed (``pytest -s``) and is in the failure message.
"""

from collections import defaultdict

from math_corpus import CASES

from rlplat.reward import REWARD_FUNCTIONS


def _table(rows: dict[str, list[bool]]) -> str:
    lines = [f"{'category':32s} {'n':>3s} {'graded right':>12s}"]
    for category, graded in sorted(rows.items()):
        lines.append(f"{category:32s} {len(graded):3d} {sum(graded) / len(graded):12.0%}")
    return "\n".join(lines)


def test_math_scorer_on_the_labelled_corpus():
    assert len(CASES) >= 150
    math = REWARD_FUNCTIONS.get("math")
    by_category: dict[str, list[bool]] = defaultdict(list)
    accepted_right, wrong_accepted = [], []
    for case in CASES:
        accepted = math("math", case.response, case.ground_truth, None) == 1.0
        by_category[case.category].append(accepted == case.right)
        if case.right:
            accepted_right.append(accepted)
        elif accepted:
            wrong_accepted.append(case)
    table = _table(by_category)
    print("\n" + table)
    share = sum(accepted_right) / len(accepted_right)
    assert not wrong_accepted, f"wrong answers accepted: {wrong_accepted}\n{table}"
    assert share >= 0.97, f"{share:.1%} of {len(accepted_right)} right answers accepted (target 97%)\n{table}"
