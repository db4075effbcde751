"""Rewards: rule-based scorers chosen by data_source, custom functions, weighted managers.

A custom reward function is a Python file with one function of the common signature::

    # my_reward.py
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        # solution_str: the decoded response; ground_truth: reward_model.ground_truth of the row;
        # extra_info: the row's extra_info dict. Return a float, or a dict with "score" (+ optional
        # "acc" = 1/0 correctness for validation accuracy, and other numbers logged as reward/<fn>/<key>).
        return 1.0 if solution_str.strip() == ground_truth else 0.0

It runs in reward worker processes (``reward.isolation=process``, ``reward.num_workers`` of them, calls
spread over them) with ``reward.timeout_s`` seconds per call; an exception, a timeout, a crash or a bad
value (None, str, NaN, ±inf, a list...) scores that sample 0 and is counted, and a step or a validation
where every call fails (``reward.fail_fraction_to_stop``) stops the run.

selected with ``reward.custom_fn.path=my_reward.py`` (and ``reward.custom_fn.name=my_fn`` for a name other
than ``compute_score``). With the default ``reward.functions=[auto]`` it replaces ``auto``; with other
functions listed it is added to them with weight 1.0. Built-ins are combined by name, e.g.
``reward.functions=[countdown,format] reward.weights=[1.0,0.2]``; ``auto`` picks the scorer from each
row's ``data_source``.
"""

from rlplat.reward.calls import CallOutcome, ModelOutcomes, RewardFailure, RewardValue
from rlplat.reward.equivalence import math_equal, normalize_math
from rlplat.reward.errors import BadRewardValue, RewardConfigError, RewardsFailing, UnknownDataSourceError
from rlplat.reward.scorers import (
    REWARD_FUNCTIONS,
    last_boxed,
    load_custom_function,
    safe_arithmetic,
    scorer_for,
)

# The manager's names load on first use: the reward worker process imports this package for the scorers
# and must not pay for torch (its memory and start-up time in every such process).
_MANAGER_NAMES = ("OverlongShaping", "RewardManager", "ScoreReport", "build_reward_manager",
                  "token_level_scores")


def __getattr__(name: str):
    if name in _MANAGER_NAMES:
        from rlplat.reward import manager

        return getattr(manager, name)
    raise AttributeError(f"module 'rlplat.reward' has no attribute {name!r}")


__all__ = [
    "REWARD_FUNCTIONS", "BadRewardValue", "CallOutcome", "ModelOutcomes", "OverlongShaping", "RewardConfigError",
    "RewardFailure", "RewardManager", "RewardValue", "RewardsFailing", "ScoreReport", "UnknownDataSourceError",
    "build_reward_manager", "last_boxed", "load_custom_function", "math_equal", "normalize_math", "safe_arithmetic",
    "scorer_for", "token_level_scores",
]
