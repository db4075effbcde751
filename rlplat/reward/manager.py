"""From decoded responses to scores: weighted reward functions, error isolation, overlong shaping.

    texts, data_sources, ground_truths, extra_infos, response_lengths
      -> RewardManager.score: Σ_f weight_f · f(data_source, text, ground_truth, extra_info)   per sample
                              + OverlongShaping(response_length)                            (optional)
      -> token_level_scores: each score on its response's last valid token   [batch, response_len]

A reward function that raises on one sample scores 0 for it and is counted (``ScoreResult.num_errors``);
the first traceback of a manager is printed to stderr once. The exception is
:class:`~rlplat.reward.scorers.UnknownDataSourceError`, a configuration error, which propagates.
"""

from __future__ import annotations

import math
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rlplat.registry import UnknownNameError
from rlplat.reward.scorers import (
    REWARD_FUNCTIONS,
    RewardConfigError,
    UnknownDataSourceError,
    load_custom_function,
)


@dataclass(frozen=True)
class OverlongShaping:
    """DAPO soft overlong punishment (2503.14476, eq. 13), added to the score.

    For a response of L tokens, L_max = ``max_response_length``, L_c = ``buffer_length``:
    0 if L <= L_max − L_c; (L_max − L_c − L) / L_c · ``penalty_factor`` if L_max − L_c < L <= L_max;
    −``penalty_factor`` if L > L_max. The paper's penalty is −1 at L_max; ``penalty_factor`` scales it, as
    verl's DAPO recipe does. Config: ``algorithm.overlong_buffer.{enable,length,penalty_factor}`` with
    L_max = ``data.max_response_length``.
    """

    max_response_length: int
    buffer_length: int
    penalty_factor: float = 1.0

    def __post_init__(self):
        if not 0 < self.buffer_length <= self.max_response_length:
            raise ValueError(
                f"overlong buffer_length (algorithm.overlong_buffer.length) must be in (0, max_response_length="
                f"{self.max_response_length}], got {self.buffer_length}"
            )
        if self.penalty_factor < 0:
            raise ValueError(f"overlong penalty_factor (algorithm.overlong_buffer.penalty_factor) must be >= 0, "
                             f"got {self.penalty_factor}")

    def __call__(self, length: int) -> float:
        start = self.max_response_length - self.buffer_length
        if length <= start:
            return 0.0
        if length <= self.max_response_length:
            return (start - length) / self.buffer_length * self.penalty_factor
        return -self.penalty_factor


@dataclass
class ScoreResult:
    """What :meth:`RewardManager.score` returns, one entry per sample in every list."""

    scores: list[float]  # weighted sum of the functions + overlong shaping
    per_function: dict[str, list[float]] = field(default_factory=dict)  # unweighted, keyed by function name
    num_errors: int = 0  # (function, sample) calls that raised or returned a non-finite value
    overlong: list[float] = field(default_factory=list)  # the shaping term of each score; [] when disabled


def _name(fn: Callable) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


class RewardManager:
    """Scores responses with weighted reward functions ``[(fn, weight), ...]`` and optional overlong shaping.

    ``per_function`` is keyed by each function's ``__name__``; a name that repeats gets ``_2``, ``_3``, ...
    in list order. A function that raises for a sample (or returns NaN/inf) contributes 0 to that sample
    and is counted in ``num_errors``; the first such traceback of this manager is printed to stderr with
    the sample index and data_source, later ones are only counted. ``UnknownDataSourceError`` propagates.
    """

    def __init__(self, functions: Sequence[tuple[Callable, float]], overlong: OverlongShaping | None = None):
        if not functions:
            raise ValueError("a RewardManager needs at least one reward function")
        self.functions = [(fn, float(weight)) for fn, weight in functions]
        self.overlong = overlong
        self.names: list[str] = []  # the per_function keys, in order
        for fn, _ in self.functions:
            name, k = _name(fn), 1
            while name in self.names:
                k += 1
                name = f"{_name(fn)}_{k}"
            self.names.append(name)
        self._reported = False

    def _call(self, fn: Callable, index: int, args: tuple) -> float | None:
        """``fn(*args)`` as a float, or None after an exception (the first one is printed)."""
        try:
            value = float(fn(*args))
            if not math.isfinite(value):
                raise ValueError(f"reward function returned {value}")
            return value
        except UnknownDataSourceError:
            raise
        except Exception:
            if not self._reported:
                self._reported = True
                print(f"[rlplat.reward] {_name(fn)} raised on sample {index} (data_source {args[0]!r}); it scores "
                      f"0 there, and further errors of this manager are only counted in reward/num_errors:\n"
                      f"{traceback.format_exc()}", file=sys.stderr, flush=True)
            return None

    def score(self, texts: Sequence[str], data_sources: Sequence[str], ground_truths: Sequence[str],
              extra_infos: Sequence[dict | None], response_lengths: Sequence[int]) -> ScoreResult:
        """Score ``len(texts)`` samples; every argument has one entry per sample (lengths in tokens)."""
        columns = {"data_sources": data_sources, "ground_truths": ground_truths, "extra_infos": extra_infos,
                   "response_lengths": response_lengths}
        for key, column in columns.items():
            if len(column) != len(texts):
                raise ValueError(f"score() got {len(texts)} texts but {len(column)} {key}")
        result = ScoreResult(scores=[0.0] * len(texts))
        rows = list(zip(data_sources, texts, ground_truths, extra_infos))
        for (fn, weight), name in zip(self.functions, self.names):
            values = result.per_function[name] = []
            for i, args in enumerate(rows):
                value = self._call(fn, i, args)
                result.num_errors += value is None
                values.append(0.0 if value is None else value)
                result.scores[i] += weight * values[-1]
        if self.overlong is not None:
            result.overlong = [self.overlong(int(n)) for n in response_lengths]
            result.scores = [s + o for s, o in zip(result.scores, result.overlong)]
        return result


def token_level_scores(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Each sequence's score on its last valid response token; zeros elsewhere.

    ``scores`` [batch], ``response_mask`` [batch, response_len] (bool/int/float, 1 = valid token) ->
    float32 [batch, response_len] on the mask's device. "Last valid" is the highest index where the mask
    is set, so a mask with holes still gets the score at its end; a row with no valid token gets nothing.
    """
    if scores.dim() != 1 or response_mask.dim() != 2 or scores.shape[0] != response_mask.shape[0]:
        raise ValueError(f"token_level_scores needs scores [batch] and response_mask [batch, response_len]; got "
                         f"{tuple(scores.shape)} and {tuple(response_mask.shape)}")
    mask = response_mask.bool()
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    if mask.shape[1] == 0:
        return out
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask, positions, -1).amax(dim=-1)  # [batch]; -1 = no valid token
    rows = (last >= 0).nonzero().squeeze(-1)
    out[rows, last[rows]] = scores.to(device=mask.device, dtype=torch.float32)[rows]
    return out


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    """``cfg.key`` for DictConfig, dict or dataclass-like objects; ``default`` when absent."""
    if cfg is None:
        return default
    value = cfg.get(key, default) if isinstance(cfg, Mapping) else getattr(cfg, key, default)  # DictConfig: Mapping
    return default if value is None else value


def build_reward_manager(reward_cfg: Any, overlong_cfg: Any = None,
                         max_response_length: int | None = None) -> RewardManager:
    """A :class:`RewardManager` from the ``reward`` config (and ``algorithm.overlong_buffer``).

    * ``reward.functions`` (names in :data:`REWARD_FUNCTIONS`) with ``reward.weights`` (one float each).
    * ``reward.custom_fn.path`` (+ ``.name``, default ``compute_score``): when ``functions`` is just
      ``[auto]`` (the default), the custom function **replaces** ``auto`` and keeps its weight, so
      ``reward.custom_fn.path=my_reward.py`` alone scores with the custom function only; otherwise it is
      **added** after the named functions with weight 1.0 (e.g. ``reward.functions=[format]`` + a custom
      correctness function = format + correctness).
    * ``overlong_cfg.enable`` / ``.length`` / ``.penalty_factor``: DAPO overlong shaping with
      L_max = ``max_response_length`` (``data.max_response_length``).
    """
    names = list(_get(reward_cfg, "functions", ["auto"]))
    weights = [float(w) for w in _get(reward_cfg, "weights", [1.0] * len(names))]
    if len(names) != len(weights):
        raise RewardConfigError(f"reward.weights has {len(weights)} entries but reward.functions has {len(names)}")
    functions = []
    for i, (name, weight) in enumerate(zip(names, weights)):
        if name not in REWARD_FUNCTIONS:
            raise UnknownNameError(f"reward.functions[{i}]={name!r} is not a registered reward function; "
                                   f"{REWARD_FUNCTIONS.suggestion(name)}")
        functions.append((REWARD_FUNCTIONS.get(name), weight))
    custom_cfg = _get(reward_cfg, "custom_fn")
    path = _get(custom_cfg, "path")
    if path:
        try:
            custom = load_custom_function(str(path), str(_get(custom_cfg, "name", "compute_score")))
        except (OSError, ImportError, AttributeError, TypeError) as err:  # each message names the file and key
            raise RewardConfigError(str(err)) from err
        functions = [(custom, weights[0])] if names == ["auto"] else [*functions, (custom, 1.0)]
    if not functions:
        raise RewardConfigError("reward.functions is empty and reward.custom_fn.path is not set: nothing to score with")
    overlong = None
    if _get(overlong_cfg, "enable", False):
        if max_response_length is None:
            raise RewardConfigError("algorithm.overlong_buffer.enable=true needs data.max_response_length")
        length = _get(overlong_cfg, "length")
        if length is None:
            raise RewardConfigError("algorithm.overlong_buffer.enable=true needs algorithm.overlong_buffer.length")
        overlong = OverlongShaping(int(max_response_length), int(length),
                                   float(_get(overlong_cfg, "penalty_factor", 1.0)))
    return RewardManager(functions, overlong)
