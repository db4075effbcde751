"""From decoded responses to scores: weighted reward functions, error isolation, overlong shaping.

    texts, data_sources, ground_truths, extra_infos, response_lengths
      -> RewardManager.score: Σ_f weight_f · f(data_source, text, ground_truth, extra_info)   per sample
                              (a function in ``only_when_correct`` counts only on samples the
                              others judge correct, e.g. a format reward)
                              + OverlongShaping(response_length)                            (optional)
      -> token_level_scores: each score on its response's last valid token   [batch, response_len]

A reward function may return a float or a dict with ``score`` (+ ``acc`` and other numeric fields). A call
that raises, returns anything else (None, a string, NaN, ±inf, a list, ...), times out or kills the reward
worker process scores 0 for that sample and is counted (``ScoreReport.num_errors``); the first message of a
manager is printed to stderr once; :func:`rlplat.reward.batch.score_batch` stops the run when too many of a
step's calls fail (``reward.fail_fraction_to_stop``). :class:`~rlplat.reward.scorers.UnknownDataSourceError`, a
configuration error, propagates.
"""

from __future__ import annotations

import copy
import math
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from rlplat.algorithms.reward_shaping import OverlongShaping
from rlplat.config.validate import reward_weights_problem
from rlplat.registry import UnknownNameError
from rlplat.reward.calls import (ModelOutcomes, RewardFailure, RewardValue, call_batch, function_name, is_batched,
                                 needs_ground_truth)
from rlplat.reward.errors import RewardConfigError
from rlplat.reward.isolation import InProcessExecutor, ProcessPool, RewardExecutor, StopRule
from rlplat.reward.scorers import REWARD_FUNCTIONS, ModelRewardFunction, load_custom_function


@dataclass
class ScoreReport:
    """What :meth:`RewardManager.score` returns, one entry per sample in every list."""

    scores: list[float]  # weighted sum of the functions + overlong shaping
    per_function: dict[str, list[float]] = field(default_factory=dict)  # unweighted, keyed by function name
    num_errors: int = 0  # (function, sample) calls that raised, timed out, crashed or returned a bad value
    num_calls: int = 0  # (function, sample) calls made
    overlong: list[float] = field(default_factory=list)  # the shaping term of each score; [] when disabled
    acc: list[float | None] = field(default_factory=list)  # the first function's ``acc`` per sample, if any
    extras: dict[str, list[float]] = field(default_factory=dict)  # "<function>/<field>": other dict fields
    first_error: str | None = None  # the first error message of this call (function, sample, value)
    # per function: std of its values, errors, timeouts, latency_mean_s, latency_max_s (seconds per call)
    stats: dict[str, dict[str, float]] = field(default_factory=dict)

    def correct(self) -> list[float]:
        """Per sample, 1.0 if correct: the reward function's ``acc`` when it gave one, else the documented
        fallback rule ``score >= 1`` (the built-in scorers give exactly 1.0 for a correct answer)."""
        return [float(a) if a is not None else float(s >= 1.0) for a, s in zip(self.acc, self.scores)]

    @property
    def accuracy_source(self) -> str:
        """``acc`` when every sample's correctness came from an ``acc`` field, ``score>=1`` when none did."""
        given = sum(a is not None for a in self.acc)
        return "acc" if given == len(self.acc) and given else "score>=1" if not given else "mixed"


_name = function_name


class RewardManager:
    """Scores responses with weighted reward functions ``[(fn, weight), ...]`` and optional overlong shaping.

    ``per_function`` is keyed by each function's ``__name__``; a name that repeats gets ``_2``, ``_3``, ...
    in list order. A function may return a float or a dict with ``score`` (+ optional ``acc`` and other
    numeric fields); see :func:`~rlplat.reward.calls.check_result`. A call that raises, returns a bad
    value, times out or crashes the worker process contributes 0 to that sample and is counted in
    ``num_errors``; the first such message of this manager is printed to stderr, later ones are only
    counted. ``UnknownDataSourceError`` propagates. ``isolation="process"`` runs the functions in a worker
    process with ``timeout_s`` per call; ``"inprocess"`` calls them directly (no timeout). A batched function
    (TRL's signature, :func:`~rlplat.reward.calls.is_batched`) is called once per batch, in this process.

    ``only_when_correct`` holds indices into ``functions`` whose value counts only on samples that the
    other functions judge correct (:meth:`ScoreReport.correct` over them: their ``acc``, else their
    weighted sum >= 1): e.g. a format reward that a wrong answer does not earn; their ``per_function`` values
    are the gated ones, so the terms still add up to the scores.
    """

    def __init__(self, functions: Sequence[tuple[Callable, float]], overlong: OverlongShaping | None = None,
                 isolation: str = "inprocess", timeout_s: float = 30.0, only_when_correct: Sequence[int] = (),
                 num_workers: int = 1, fail_fraction_to_stop: float = 1.0):
        if not functions:
            raise ValueError("a RewardManager needs at least one reward function")
        self.functions = [(fn, float(weight)) for fn, weight in functions]
        self.gated = frozenset(only_when_correct)
        if len(self.gated) >= len(self.functions):
            raise RewardConfigError("reward.only_when_correct names every reward function: none is left to judge "
                                    "correctness")
        self.overlong = overlong
        self.names: list[str] = []  # the per_function keys, in order
        for fn, _ in self.functions:
            name, k = _name(fn), 1
            while name in self.names:
                k += 1
                name = f"{_name(fn)}_{k}"
            self.names.append(name)
        # the per-sample functions' index in the executor; a batched one is called here, once per batch
        per_sample = [k for k, (fn, _) in enumerate(self.functions) if not is_batched(fn)]
        self.pooled = {k: j for j, k in enumerate(per_sample)}
        fns = [self.functions[k][0] for k in self.pooled]
        names = [self.names[k] for k in self.pooled]
        self.fail_fraction_to_stop = float(fail_fraction_to_stop)
        self.executor: RewardExecutor
        if isolation == "process" and fns:
            self.executor = ProcessPool(fns, names, timeout_s, max(1, int(num_workers)))
        elif isolation in ("process", "inprocess"):
            self.executor = InProcessExecutor(fns, names)
        else:
            raise RewardConfigError(f"reward.isolation={isolation!r}: expected process or inprocess")
        self._reported = False

    def check_answers(self, prompt_only: Mapping[str, list[str]]) -> None:
        """Refuse prompt-only rows (``prompt_only``: by split, where each is, e.g. ``train.parquet row 3``) when a
        reward function needs each row's ground truth (:func:`~rlplat.reward.calls.needs_ground_truth`)."""
        needing = [name for (fn, _), name in zip(self.functions, self.names) if needs_ground_truth(fn)]
        for split, rows in prompt_only.items():
            if rows and needing:
                raise RewardConfigError(
                    f"{rows[0]} has no reward_model.ground_truth ({len(rows)} {split} row(s) have none), and reward "
                    f"function(s) {', '.join(map(repr, needing))} need one: give every row an answer, or score with "
                    f"functions that need none (format, reward_model, or your own with a ground_truth=None default)")

    def for_validation(self) -> RewardManager:
        """The same functions, weights and gating, without the training-only overlong shaping; it shares
        this manager's reward worker process (one process per run, not one per manager)."""
        twin = copy.copy(self)
        twin.overlong, twin._reported = None, False
        return twin

    def _report(self, message: str) -> None:
        if not self._reported:
            self._reported = True
            print(f"[rlplat.reward] {message}\n[rlplat.reward] that sample scores 0 for this function; further "
                  f"errors of this manager are only counted in reward/num_errors", file=sys.stderr, flush=True)

    def score(self, texts: Sequence[str], data_sources: Sequence[str], ground_truths: Sequence[str],
              extra_infos: Sequence[dict | None], response_lengths: Sequence[int],
              prompts: Sequence[Any] | None = None,
              model_outcomes: Mapping[str, ModelOutcomes] | None = None) -> ScoreReport:
        """Score ``len(texts)`` samples; every argument has one entry per sample (lengths in tokens).
        ``prompts`` (each prompt's chat messages) go to the functions that take a ``prompt`` argument.
        ``model_outcomes``: for each model-computed function (:class:`~rlplat.reward.scorers.ModelRewardFunction`,
        by name), :class:`~rlplat.reward.calls.ModelOutcomes`: one outcome per sample computed by a model — a
        ``RewardValue``, or a ``RewardFailure`` counted as a failed call — and the seconds they took."""
        prompts = [None] * len(texts) if prompts is None else prompts
        columns = {"data_sources": data_sources, "ground_truths": ground_truths, "extra_infos": extra_infos,
                   "response_lengths": response_lengths, "prompts": prompts}
        for key, column in columns.items():
            if len(column) != len(texts):
                raise ValueError(f"score() got {len(texts)} texts but {len(column)} {key}")
        result = ScoreReport(scores=[0.0] * len(texts), acc=[None] * len(texts))
        rows = list(zip(data_sources, texts, ground_truths, extra_infos, prompts))
        correct: list[float] | None = None
        ungated_first = sorted(range(len(self.functions)), key=lambda k: k in self.gated)
        for k in ungated_first:
            (_, weight), name = self.functions[k], self.names[k]
            if k in self.gated and correct is None:
                correct = result.correct()  # so far the scores hold only the ungated functions
            values = result.per_function[name] = []
            timings: list = [None] * len(rows)
            errors = 0
            if isinstance(self.functions[k][0], ModelRewardFunction):
                given = self._model_outcomes(k, model_outcomes, len(rows))
                outcomes = given.outcomes
                timings = [(given.seconds / max(len(rows), 1), False)] * len(rows)  # the batch's time, per sample
            elif k not in self.pooled:
                start = time.perf_counter()
                outcomes = call_batch(self.functions[k][0], name, rows)
                timings = [((time.perf_counter() - start) / max(len(rows), 1), False)] * len(rows)
            else:
                outcomes = self._run(k, rows, result.num_errors, timings)
            for i, outcome in enumerate(outcomes):
                result.num_calls += 1
                if isinstance(outcome, RewardFailure):
                    result.num_errors += 1
                    errors += 1
                    result.first_error = result.first_error or outcome.message.splitlines()[0]
                    self._report(outcome.message.rstrip())
                    outcome = RewardValue(0.0)
                score, acc, extras = outcome.score, outcome.acc, outcome.extras
                if correct is not None:
                    score, acc = score * correct[i], None
                values.append(score)
                result.scores[i] += weight * score
                if acc is not None and result.acc[i] is None:
                    result.acc[i] = acc
                for key, value in extras.items():
                    result.extras.setdefault(f"{name}/{key}", []).append(value)
            result.stats[name] = _call_stats(values, errors, timings)
        if self.overlong is not None:
            result.overlong = [self.overlong(int(n)) for n in response_lengths]
            result.scores = [s + o for s, o in zip(result.scores, result.overlong)]
        result.per_function = {name: result.per_function[name] for name in self.names}
        return result

    def _model_outcomes(self, k: int, given: Mapping[str, ModelOutcomes] | None, n: int) -> ModelOutcomes:
        name = _name(self.functions[k][0])
        scores = (given or {}).get(name)
        if not isinstance(scores, ModelOutcomes) or len(scores.outcomes) != n:
            raise ValueError(f"reward function {name!r} is computed by model workers: score() needs "
                             f"model_outcomes[{name!r}], ModelOutcomes with {n} outcomes, got {scores!r:.80}")
        return scores

    def _run(self, k: int, rows: list, errors_so_far: int, timings: list) -> list:
        """Function ``k``'s outcomes for ``rows`` (each call's time into ``timings``); an executor that can
        (a process pool) gives up early (:class:`RewardsFailing`) once the batch has as many failed calls as
        ``fail_fraction_to_stop`` allows (1 = all calls, > 1 = never), or when a reward hangs on everything."""
        if self.fail_fraction_to_stop > 1:
            return self.executor.run(self.pooled[k], rows, timings=timings)
        allowed = math.ceil(self.fail_fraction_to_stop * len(rows) * len(self.functions)) - errors_so_far
        return self.executor.run(self.pooled[k], rows, stop=StopRule(errors=max(1, allowed), hung=True),
                                 timings=timings)

    def close(self) -> None:
        """Stop the reward worker processes (if any)."""
        self.executor.close()


def _call_stats(values: list[float], errors: int, timings: list) -> dict[str, float]:
    """One function's figures over a batch: the std of its values, its failed and timed-out calls, and the
    mean and largest seconds per call."""
    seconds = [t[0] for t in timings if t is not None]
    mean = sum(values) / max(len(values), 1)
    return {"std": math.sqrt(sum((v - mean) ** 2 for v in values) / max(len(values), 1)),
            "errors": float(errors), "timeouts": float(sum(1 for t in timings if t is not None and t[1])),
            "latency_mean_s": sum(seconds) / max(len(seconds), 1), "latency_max_s": max(seconds, default=0.0)}


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
    names, weights = _named_functions(reward_cfg)
    functions = []
    for i, (name, weight) in enumerate(zip(names, weights)):
        if name not in REWARD_FUNCTIONS:
            raise UnknownNameError(f"reward.functions[{i}]={name!r} is not a registered reward function; "
                                   f"{REWARD_FUNCTIONS.suggestion(name)}")
        fn = REWARD_FUNCTIONS.get(name)
        if hasattr(fn, "configured"):  # a built-in with settings in the reward section (reward.code)
            fn = fn.configured(reward_cfg)
        if name == "code":  # its sandbox needs an interpreter its user can run: say so now, not per call
            from rlplat.utils.sandbox import python_interpreter

            try:
                python_interpreter()
            except RuntimeError as err:
                raise RewardConfigError(f"reward.functions[{i}]=code: {err}") from None
        functions.append((fn, weight))
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
    overlong = _overlong_shaping(overlong_cfg, max_response_length) if _get(overlong_cfg, "enable", False) else None
    gated = [i for i, name in enumerate(names) if name in set(_get(reward_cfg, "only_when_correct", []))]
    return RewardManager(functions, overlong, isolation=str(_get(reward_cfg, "isolation", "process")),
                         timeout_s=float(_get(reward_cfg, "timeout_s", 30.0)), only_when_correct=gated,
                         num_workers=reward_workers(_get(reward_cfg, "num_workers")),
                         fail_fraction_to_stop=float(_get(reward_cfg, "fail_fraction_to_stop", 1.0)))


def _named_functions(reward_cfg: Any) -> tuple[list[str], list[float]]:
    """``reward.functions`` and their weights, checked against the model rewards configured (a reward model or
    a judge that is set replaces the default ``[auto]``, and must be listed when other functions are)."""
    names = list(_get(reward_cfg, "functions", ["auto"]))
    weights = [float(w) for w in _get(reward_cfg, "weights", [1.0] * len(names))]
    if problem := reward_weights_problem(names, weights):
        raise RewardConfigError(problem)
    judge_cfg = _get(reward_cfg, "judge")
    configured = {"reward_model": ("reward.model.path", bool(_get(_get(reward_cfg, "model"), "path"))),
                  "judge": ("reward.judge.model_path or reward.judge.url",
                            bool(_get(judge_cfg, "model_path") or _get(judge_cfg, "url")))}
    if names == ["auto"] and not _get(_get(reward_cfg, "custom_fn"), "path") and any(on for _, on in configured.values()):
        names = [name for name, (_, on) in configured.items() if on]  # model rewards replace the default
        weights = [weights[0]] * len(names)
    for name, (keys, on) in configured.items():
        if on and name not in names:
            raise RewardConfigError(f"{keys} is set but reward.functions={names} does not list {name}; add it "
                                    f"(with a weight in reward.weights)")
        if name in names and not on:
            raise RewardConfigError(f"reward.functions lists {name} but {keys} is not set")
    if "judge" in names:
        from rlplat.reward.judge import check_template

        try:
            check_template(str(_get(judge_cfg, "prompt_template", "")))
        except ValueError as err:
            raise RewardConfigError(str(err)) from None
    return names, weights


def _overlong_shaping(overlong_cfg: Any, max_response_length: int | None) -> OverlongShaping:
    if max_response_length is None:
        raise RewardConfigError("algorithm.overlong_buffer.enable=true needs data.max_response_length")
    length = _get(overlong_cfg, "length")
    if length is None:
        raise RewardConfigError("algorithm.overlong_buffer.enable=true needs algorithm.overlong_buffer.length")
    return OverlongShaping(int(max_response_length), int(length), float(_get(overlong_cfg, "penalty_factor", 1.0)))


def reward_workers(configured: int | None) -> int:
    """``reward.num_workers``: as configured, or (None) one per CPU core up to 8."""
    return int(configured) if configured else max(1, min(8, os.cpu_count() or 1))
