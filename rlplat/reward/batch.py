"""Scoring a generated batch: from its decoded responses to the scores the reward stage adds.

    batch (data_source, ground_truth, extra_info, raw_prompt; response_mask) + its decoded responses
      -> model_outcomes: each model-computed reward's outcomes, from the scorers the trainer passes in
         (reward model: its logits, standardised over the batch if asked; judge: its answers, parsed)
      -> RewardManager.score -> ScoreReport, plus each agent environment's reward terms
      -> stop the run (RunError) when reward.fail_fraction_to_stop of the calls failed
      -> training_scores: TrainingScores (scores [batch], terms [batch, num_terms], weights, metrics)
    join_scores: the TrainingScores of several batches as one (the rollout queue scores each call's batch)

The model scorers are plain callables (:class:`ModelScorers`) that the trainer builds over its worker groups
or the judge's server, so nothing here knows about workers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rlplat.protocol import Batch
from rlplat.reward.calls import ModelOutcomes, RewardFailure, RewardValue
from rlplat.reward.errors import RewardsFailing
from rlplat.reward.judge import judge_prompts, parse_verdict
from rlplat.reward.manager import RewardManager, ScoreReport
from rlplat.utils.errors import RunError


@dataclass(frozen=True)
class ModelScorers:
    """What computes the model-based reward functions (None: not configured)."""

    # (each prompt's chat messages, each response) -> each sample's logit: the reward model (reward_model)
    reward_model: Callable[[list, list[str]], Sequence[float]] | None = None
    # (each sample's judge prompt) -> the judge's answer, or the error that stood in its way (judge)
    judge: Callable[[list[str]], Sequence[str | BaseException]] | None = None


@dataclass(frozen=True)
class TrainingScores:
    """A training batch's scores as tensors, with their reward terms and metrics, as the reward stage adds them."""

    scores: torch.Tensor  # [batch] the weighted sum of the reward functions (+ overlong shaping)
    # [batch, num_terms]: each reward function's unweighted value (reward.functions order), then the overlong
    # shaping term when enabled, so that terms @ weights == scores (gdpo normalises each term on its own)
    terms: torch.Tensor
    weights: torch.Tensor  # [num_terms]
    metrics: dict[str, float]  # errors, per-function means, extra fields of dict rewards
    names: tuple[str, ...] = ()  # [num_terms]: each term's name (a function's, "overlong", "environment/...")


def score_batch(manager: RewardManager, batch: Batch, texts: list[str], reward_cfg: Any, scorers: ModelScorers,
                validation: bool = False) -> ScoreReport:
    """Score a generated batch whose decoded responses are ``texts``; stop the run (:class:`RunError`) when at
    least ``reward.fail_fraction_to_stop`` of its reward calls failed."""
    nt = batch.non_tensors
    limit = reward_cfg.fail_fraction_to_stop
    where = f"{'validation at ' if validation else ''}step {batch.meta.get('step', '?')}"
    consequence = "its accuracy would be meaningless" if validation else "the step would train on zeros"
    prompts = list(nt["raw_prompt"]) if "raw_prompt" in nt else None
    try:
        result = manager.score(
            texts, list(nt["data_source"]), list(nt["ground_truth"]), list(nt["extra_info"]),
            batch.tensors["response_mask"].sum(-1).tolist(), prompts=prompts,
            model_outcomes=model_outcomes(scorers, reward_cfg, prompts, texts, list(nt["ground_truth"])),
        )
    except RewardsFailing as failing:
        raise RunError(f"{where}: {failing} (reward.fail_fraction_to_stop={limit:g}), so {consequence}; "
                       f"first error: {failing.first_error}") from None
    add_environment_rewards(result, list(nt["extra_info"]))
    if result.num_errors and result.num_errors >= limit * result.num_calls:
        raise RunError(f"{where}: {result.num_errors} of {result.num_calls} reward calls failed "
                       f"(reward.fail_fraction_to_stop={limit:g}), so {consequence}; "
                       f"first error: {result.first_error}")
    return result


def model_outcomes(scorers: ModelScorers, reward_cfg: Any, prompts: list | None, texts: list[str],
                   ground_truths: list) -> dict[str, ModelOutcomes] | None:
    """The outcome per sample of each model-computed reward function: ``reward_model`` (its logit, or
    standardised over the batch with ``reward.model.normalize=batch``; a non-finite one is a failed
    call) and ``judge`` (its verdict, or why it could not be read)."""
    if scorers.reward_model is None and scorers.judge is None:
        return None
    if prompts is None:
        raise RunError("model-based rewards need each sample's prompt messages (raw_prompt), which this batch lacks")
    outcomes = {}
    if scorers.reward_model is not None:
        start = time.perf_counter()
        scores = torch.tensor(scorers.reward_model(prompts, texts), dtype=torch.float64)
        finite = torch.isfinite(scores)
        if reward_cfg.model.normalize == "batch" and finite.sum() > 1:
            kept = scores[finite]
            scores = (scores - kept.mean()) / kept.std(unbiased=False).clamp_min(1e-8)
        outcomes["reward_model"] = ModelOutcomes(
            [RewardValue(float(s)) if ok else RewardFailure("bad_value", f"the reward model gave {float(s)} on sample {i}")
             for i, (s, ok) in enumerate(zip(scores.tolist(), finite.tolist()))], time.perf_counter() - start)
    if scorers.judge is not None:
        start = time.perf_counter()
        judge = reward_cfg.judge
        answers = scorers.judge(judge_prompts(judge.prompt_template, prompts, texts, ground_truths))
        outcomes["judge"] = ModelOutcomes([RewardFailure("exception", str(a)) if isinstance(a, BaseException) else
                                           parse_verdict(a, judge.verdict, judge.score_min, judge.score_max, i)
                                           for i, a in enumerate(answers)], time.perf_counter() - start)
    return outcomes


def training_scores(manager: RewardManager, result: ScoreReport) -> TrainingScores:
    """A training batch's :class:`TrainingScores` from its :class:`ScoreReport` (by ``manager``): the scores and
    each reward term as tensors, and the ``reward/*`` and ``reward_calls/*`` metrics."""
    correct = result.correct()  # the reward's acc, else score >= 1: what val/accuracy counts
    metrics = {"reward/num_errors": float(result.num_errors),
               "reward/accuracy": sum(correct) / max(len(correct), 1)}
    for name, values in {**result.per_function, **result.extras}.items():
        metrics[f"reward/{name}_mean"] = sum(values) / max(len(values), 1)
    for name, stats in result.stats.items():  # seconds under timing/: they differ from run to run
        metrics.update({f"{'timing/' if key.startswith('latency') else ''}reward_calls/{name}_{key}": value
                        for key, value in stats.items()})
    columns = [result.per_function[name] for name in manager.names]
    weights = [weight for _, weight in manager.functions]
    names = list(manager.names)
    if manager.overlong is not None:
        columns.append(result.overlong)
        weights.append(1.0)
        names.append("overlong")
    for name in sorted(key for key in result.extras if key.startswith("environment/")):
        columns.append(result.extras[name])  # an agent environment's reward term (add_environment_rewards)
        weights.append(1.0)
        names.append(name)
    terms = torch.tensor(columns, dtype=torch.float32).T.reshape(len(result.scores), len(columns))
    return TrainingScores(torch.tensor(result.scores, dtype=torch.float32), terms, torch.tensor(weights), metrics,
                          tuple(names))


def join_scores(parts: list[TrainingScores]) -> TrainingScores:
    """The :class:`TrainingScores` of several batches as those of their rows in order: rows' scores and terms
    joined, metrics over all rows (means weighted by rows, counts added, the largest latency, each function's std
    pooled from the parts' means and stds)."""
    if len(parts) == 1:
        return parts[0]
    rows = [len(part.scores) for part in parts]
    metrics = {}
    for key in dict.fromkeys(key for part in parts for key in part.metrics):
        having = [(part.metrics[key], n, part.metrics) for part, n in zip(parts, rows) if key in part.metrics]
        total = sum(n for _, n, _ in having)
        calls = key.startswith("reward_calls/")
        if key == "reward/num_errors" or calls and key.endswith(("_errors", "_timeouts")):
            metrics[key] = sum(value for value, _, _ in having)
        elif key.endswith("_latency_max_s"):
            metrics[key] = max(value for value, _, _ in having)
        elif calls and key.endswith("_std") and all((of := f"reward/{key[13:-4]}_mean") in m for _, _, m in having):
            mean = sum(m[of] * n for _, n, m in having) / total
            second = sum((value ** 2 + m[of] ** 2) * n for value, n, m in having) / total
            metrics[key] = max(second - mean ** 2, 0.0) ** 0.5
        else:
            metrics[key] = sum(value * n for value, n, _ in having) / total
    return TrainingScores(torch.cat([part.scores for part in parts]), torch.cat([part.terms for part in parts]),
                          parts[0].weights, metrics, parts[0].names)


def environment_terms(extra_info: list) -> list[str]:
    """The names of the reward terms the agents' environments gave in this batch (sorted)."""
    return sorted({name for info in extra_info for name in ((info or {}).get("agent") or {}).get("rewards", {})})


def add_environment_rewards(result: ScoreReport, extra_info: list) -> None:
    """An agent environment's reward terms (``extra_info["agent"]["rewards"]``) add to each sample's score,
    each reported as ``environment/<term>`` (0 where a trajectory's environment gave none)."""
    for name in environment_terms(extra_info):
        values = [float(((info or {}).get("agent") or {}).get("rewards", {}).get(name, 0.0)) for info in extra_info]
        result.extras[f"environment/{name}"] = values
        result.scores = [score + value for score, value in zip(result.scores, values)]
