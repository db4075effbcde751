"""One call of a reward function on one sample, and what it gives: a value, or a failure of a named kind.

:func:`call_one` calls a function and :func:`check_result` turns what it returned into a :class:`RewardValue`;
anything else ends as a :class:`RewardFailure` whose ``kind`` says what went wrong and whose ``message`` names
the function, the sample and the value or exception. The executors (:mod:`rlplat.reward.isolation`) add the
failures only they see (a timeout, a worker process that died), and a model-computed reward gives the same
two types (:class:`ModelOutcomes`). The reward worker process imports this module: it imports no torch.
"""

from __future__ import annotations

import inspect
import math
import numbers
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rlplat.reward.errors import BadRewardValue, UnknownDataSourceError

Row = tuple[str, str, str, Any, Any]  # (data_source, solution_str, ground_truth, extra_info, prompt or None)
Timing = tuple[float, bool]  # a call's seconds, and whether it ran past its deadline

# exception: the function raised; bad_value: it (or a model) returned something that is no score; timeout:
# it ran past reward.timeout_s; crash: it killed the reward worker process; config_error: ``auto`` has no
# scorer for the row's data_source, which the executor raises (UnknownDataSourceError) instead of counting
FailureKind = Literal["exception", "bad_value", "timeout", "crash", "config_error"]


@dataclass(frozen=True)
class RewardValue:
    """A call that gave a score: the score, the sample's correctness when the function gave one (``acc``),
    and its other numeric fields (logged as ``reward/<function>/<field>_mean``)."""

    score: float
    acc: float | None = None
    extras: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class RewardFailure:
    """A call that gave no score (it scores 0 and is counted): why, and a message whose first line names the
    function or model, the sample and the value or error."""

    kind: FailureKind
    message: str


CallOutcome = RewardValue | RewardFailure


@dataclass(frozen=True)
class ModelOutcomes:
    """A model-computed reward function's batch: one outcome per sample, and the seconds they took."""

    outcomes: Sequence[CallOutcome]
    seconds: float = 0.0


def function_name(fn: Callable) -> str:
    return getattr(fn, "__name__", type(fn).__name__)


def _finite(value: Any) -> float | None:
    if isinstance(value, numbers.Real):  # int, float, bool and numpy scalars
        value = float(value)
        return value if math.isfinite(value) else None
    return None


def check_result(value: Any, name: str, index: int, row: Row) -> RewardValue:
    """The :class:`RewardValue` of a reward function's return value, or :class:`BadRewardValue`.

    Accepted: a finite real number (bool and numpy scalars included), or a dict (verl style) with a finite
    ``score``, an optional finite ``acc`` and other finite numeric fields (logged as metrics; non-numeric
    ones are ignored).
    """
    if isinstance(value, dict):
        if "score" not in value:
            raise BadRewardValue(f"{where(name, index, row)} returned a dict without 'score': {show(value)}")
        score = _finite(value["score"])
        acc = None if value.get("acc") is None else _finite(value["acc"])
        if score is None or (value.get("acc") is not None and acc is None):
            raise BadRewardValue(f"{where(name, index, row)} returned {show(value)}; 'score' and 'acc' must be "
                                 f"finite numbers")
        extras = {str(k): v for k, v in ((k, _finite(v)) for k, v in value.items() if k not in ("score", "acc"))
                  if v is not None}
        return RewardValue(score, acc, extras)
    score = _finite(value)
    if score is None:
        raise BadRewardValue(f"{where(name, index, row)} returned {show(value)} ({type(value).__name__}); "
                             f"expected a finite number or a dict with a finite 'score'")
    return RewardValue(score)


def where(name: str, index: int, row: Row) -> str:
    """Which call: the function, the sample and its data_source and ground truth."""
    return (f"reward function {name!r} on sample {index} (data_source {row[0]!r}, ground_truth "
            f"{show(row[2])})")


def show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def needs_ground_truth(fn: Callable) -> bool:
    """Whether ``fn`` needs each sample's ground truth (a prompt-only row has none): its ``needs_ground_truth``
    attribute where it declares one, else whether its ``ground_truth`` parameter (the third) has no default
    value; a function written ``fn(data_source, solution_str, ground_truth=None, extra_info=None)`` scores
    prompt-only rows (given None). A batched function (:func:`is_batched`) needs none unless it declares so."""
    declared = getattr(fn, "needs_ground_truth", None)
    if declared is not None:
        return bool(declared)
    if is_batched(fn):  # reads the columns it names; a missing ground truth is a None in its list
        return False
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return True
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) < 3 or positional[2].default is inspect.Parameter.empty


def takes_prompt(fn: Callable) -> bool:
    """Whether ``fn`` accepts the sample's prompt: a parameter named ``prompt`` or ``**kwargs``."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "prompt" or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def call_one(fn: Callable, name: str, index: int, row: Row) -> CallOutcome:
    """One checked call, ``fn(data_source, solution_str, ground_truth, extra_info)`` (+ ``prompt=`` the
    prompt's chat messages when :func:`takes_prompt`); an exception or a bad value becomes a
    :class:`RewardFailure`. :class:`UnknownDataSourceError` (a configuration error) propagates."""

    try:
        value = fn(*row[:4], prompt=row[4]) if takes_prompt(fn) else fn(*row[:4])
        return check_result(value, name, index, row)
    except UnknownDataSourceError:
        raise
    except BadRewardValue as err:
        return RewardFailure("bad_value", str(err))
    except Exception as err:  # user code: any exception costs this sample only
        return RewardFailure("exception", f"{where(name, index, row)} raised {type(err).__name__}: {err}\n"
                                          f"{traceback.format_exc()}")


def is_batched(fn: Callable) -> bool:
    """Whether ``fn`` scores a whole batch in one call, as TRL's reward functions do
    (``fn(prompts=[...], completions=[...], **columns) -> list``): its ``batched`` attribute where it declares one,
    else whether it has a ``completions`` parameter."""
    declared = getattr(fn, "batched", None)
    if declared is not None:
        return bool(declared)
    try:
        return "completions" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def batch_arguments(rows: Sequence[Row], messages: bool = True) -> dict[str, list]:
    """TRL's reward-function arguments for ``rows``: ``prompts`` and ``completions`` (chat messages when
    ``messages``, TRL's conversational form: each completion ``[{"role": "assistant", "content": text}]``; else
    text), then one list per column: ``ground_truth``, ``data_source`` and each ``extra_info`` field (a row
    without it gives None)."""
    def prompt_text(prompt: Any) -> Any:
        if messages or not isinstance(prompt, (list, tuple)):
            return prompt
        return "".join(str(turn.get("content", "")) for turn in prompt)

    extras = [row[3] if isinstance(row[3], dict) else {} for row in rows]
    fields = [name for name in dict.fromkeys(key for extra in extras for key in extra)
              if name not in ("prompts", "completions", "ground_truth", "data_source")]
    arguments = {
        "prompts": [prompt_text(row[4]) for row in rows],
        "completions": [[{"role": "assistant", "content": row[1]}] if messages else row[1] for row in rows],
        "ground_truth": [row[2] for row in rows], "data_source": [row[0] for row in rows],
    }
    arguments.update({name: [extra.get(name) for extra in extras] for name in fields})
    return arguments


def call_batch(fn: Callable, name: str, rows: Sequence[Row]) -> list[CallOutcome]:
    """One call of a batched reward function (:func:`is_batched`) on ``rows``: one outcome per row. A returned
    None (TRL: the function does not apply to that sample) scores 0; an exception, a list of the wrong length or
    a bad value fails the rows it concerns."""
    try:
        values = fn(**batch_arguments(rows, getattr(fn, "completions_as_messages", True)))
        values = list(values)
    except Exception as err:  # user code: the batch's samples each get the failure
        message = (f"reward function {name!r} on a batch of {len(rows)} samples raised {type(err).__name__}: {err}\n"
                   f"{traceback.format_exc()}")
        return [RewardFailure("exception", message)] * len(rows)
    if len(values) != len(rows):
        return [RewardFailure("bad_value", f"reward function {name!r} returned {len(values)} values for a batch of "
                                           f"{len(rows)} samples; expected one per sample")] * len(rows)
    outcomes: list[CallOutcome] = []
    for index, (value, row) in enumerate(zip(values, rows)):
        try:
            outcomes.append(RewardValue(0.0) if value is None else check_result(value, name, index, row))
        except BadRewardValue as err:
            outcomes.append(RewardFailure("bad_value", str(err)))
    return outcomes
