"""From decoded responses to scores: weighted reward functions, error isolation, overlong shaping."""

from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from rlplat.reward.scorers import REWARD_FUNCTIONS, UnknownDataSourceError, load_custom_function


@dataclass(frozen=True)
class OverlongShaping:
    """DAPO soft overlong punishment (2503.14476, eq. 13), added to the score: 0 up to
    L_max − L_c tokens, then linearly down to −penalty_factor at L_max, and −penalty_factor beyond."""

    max_response_length: int
    buffer_length: int
    penalty_factor: float = 1.0

    def __call__(self, length: int) -> float:
        start = self.max_response_length - self.buffer_length
        if length <= start:
            return 0.0
        if length <= self.max_response_length:
            return (start - length) / self.buffer_length * self.penalty_factor
        return -self.penalty_factor


@dataclass
class ScoreResult:
    scores: list[float]
    per_function: dict[str, list[float]] = field(default_factory=dict)
    num_errors: int = 0


class RewardManager:
    """Scores responses with weighted reward functions. An exception in a function for one sample
    gives that function 0 for it and is counted; the first traceback is printed once."""

    def __init__(self, functions: Sequence[tuple[Callable, float]], overlong: OverlongShaping | None = None):
        if not functions:
            raise ValueError("a RewardManager needs at least one reward function")
        self.functions, self.overlong = list(functions), overlong
        self._printed = False

    def _call(self, fn, index: int, args: tuple) -> tuple[float, bool]:
        try:
            return float(fn(*args)), False
        except UnknownDataSourceError:
            raise
        except Exception:
            if not self._printed:
                self._printed = True
                print(f"[reward] {getattr(fn, '__name__', fn)} raised on sample {index} (data_source "
                      f"{args[0]!r}); scored 0, further errors are only counted:\n{traceback.format_exc()}",
                      file=sys.stderr, flush=True)
            return 0.0, True

    def score(self, texts: Sequence[str], data_sources: Sequence[str], ground_truths: Sequence[str],
              extra_infos: Sequence[dict], response_lengths: Sequence[int]) -> ScoreResult:
        result = ScoreResult(scores=[0.0] * len(texts))
        for fn, weight in self.functions:
            name = getattr(fn, "__name__", "custom")
            values = result.per_function.setdefault(name, [])
            for i, args in enumerate(zip(data_sources, texts, ground_truths, extra_infos)):
                value, failed = self._call(fn, i, args)
                result.num_errors += failed
                values.append(value)
                result.scores[i] += weight * value
        if self.overlong is not None:
            result.scores = [s + self.overlong(int(n)) for s, n in zip(result.scores, response_lengths)]
        return result


def token_level_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Put each score on its response's last valid token: ``[B]`` and ``[B, R]`` -> ``[B, R]`` float32."""
    mask = response_mask.bool()
    out = torch.zeros(mask.shape, dtype=torch.float32)
    lengths = mask.sum(-1)
    rows = (lengths > 0).nonzero().squeeze(-1)
    # the last valid position: the highest index where the mask is set
    last = (mask.long() * torch.arange(mask.shape[1])).argmax(-1)
    out[rows, last[rows]] = scores.float()[rows]
    return out


def build_reward_manager(reward_cfg, overlong_cfg=None, max_response_length: int | None = None) -> RewardManager:
    """From ``reward.*`` (and ``algorithm.overlong_buffer``): ``reward.functions`` with ``reward.weights``;
    a custom function (``reward.custom_fn.path``) replaces ``auto`` when the list is just ``[auto]``,
    and is added with weight 1.0 otherwise."""
    names, weights = list(reward_cfg.functions), [float(w) for w in reward_cfg.weights]
    if len(names) != len(weights):
        raise ValueError(f"reward.weights has {len(weights)} entries but reward.functions has {len(names)}")
    functions = [(REWARD_FUNCTIONS.get(n), w) for n, w in zip(names, weights)]
    if reward_cfg.custom_fn.path:
        custom = (load_custom_function(reward_cfg.custom_fn.path, reward_cfg.custom_fn.name), 1.0)
        functions = [custom] if names == ["auto"] else functions + [custom]
    overlong = None
    if overlong_cfg is not None and overlong_cfg.enable:
        overlong = OverlongShaping(max_response_length, overlong_cfg.length, overlong_cfg.penalty_factor)
    return RewardManager(functions, overlong)
