"""Rewards: rule-based scorers chosen by data_source, custom functions, weighted managers.

A custom reward function is a Python file with one function::

    # my_reward.py
    def compute_score(data_source, solution_str, ground_truth, extra_info=None):
        return 1.0 if solution_str.strip() == ground_truth else 0.0

selected with ``reward.custom_fn.path=my_reward.py`` (and ``reward.custom_fn.name=...`` for another
function name). Built-ins: ``reward.functions=[arithmetic,format] reward.weights=[1.0,0.2]``.
"""

from rlplat.reward.manager import OverlongShaping, RewardManager, ScoreResult, build_reward_manager, token_level_scores
from rlplat.reward.scorers import REWARD_FUNCTIONS, UnknownDataSourceError, load_custom_function

__all__ = ["REWARD_FUNCTIONS", "OverlongShaping", "RewardManager", "ScoreResult", "UnknownDataSourceError",
           "build_reward_manager", "load_custom_function", "token_level_scores"]
