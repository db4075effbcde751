"""reasoning-gym's own scorers as a reward function (``data_source`` ``reasoning_gym/<task>``).

reasoning-gym (Open-Thought, https://github.com/open-thought/reasoning-gym) generates ~100 verifiable
reasoning tasks and scores each answer with the task's ``score_answer(answer, entry)``, which reads the
generated entry (its question, answer and metadata: a puzzle's board, an expression, ...). Rows written by
``python -m rlplat.data.reasoning_gym`` keep that entry in ``extra_info["reasoning_gym_entry"]`` (JSON), and
this function hands it back to the task's own scorer, so rlplat's reward is reasoning-gym's.

The answer is read as reasoning-gym's training code reads it: the content of the last ``<answer>...</answer>``
(``reasoning_gym.utils.extract_answer``); a response without one falls back to the last ``\\boxed{...}``, and a
response with neither is scored as no answer (``score_answer(None, entry)``: 0.0 for every task).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from typing import Any

from rlplat.data.reasoning_gym import ENTRY_KEY, INSTALL, PREFIX
from rlplat.reward.equivalence import last_boxed
from rlplat.reward.errors import UnknownDataSourceError


class ReasoningGymDataError(ValueError):
    """A row that does not carry the entry reasoning-gym's scorer reads."""


def _package(data_source: str):
    try:
        import reasoning_gym.factory
        import reasoning_gym.utils
    except ImportError:
        raise UnknownDataSourceError(f"data_source {data_source!r} is scored by reasoning-gym's score_answer, and the "
                                     f"package 'reasoning_gym' is not installed; install it with: {INSTALL}") from None
    return reasoning_gym


@functools.cache
def score_answer_fn(task: str) -> Callable[[str | None, dict], float]:
    """The task's ``score_answer`` (reasoning-gym builds a dataset object per call: cached per task)."""
    return _package(PREFIX + task).factory.get_score_answer_fn(task)


def extract(solution_str: str) -> str | None:
    """The answer reasoning-gym scores: the last ``<answer>`` tag's content, else the last ``\\boxed{}``'s."""
    answer = _package("reasoning_gym/*").utils.extract_answer(solution_str)
    return answer if answer is not None else last_boxed(solution_str)


def entry_of(data_source: str, extra_info: dict | None) -> dict[str, Any]:
    text = (extra_info or {}).get(ENTRY_KEY)
    if not isinstance(text, str):
        raise ReasoningGymDataError(
            f"data_source {data_source!r}: the row has no extra_info[{ENTRY_KEY!r}] (the entry reasoning-gym's scorer "
            f"reads); write the rows with python -m rlplat.data.reasoning_gym")
    try:
        entry = json.loads(text)
    except json.JSONDecodeError as err:
        raise ReasoningGymDataError(f"data_source {data_source!r}: extra_info[{ENTRY_KEY!r}] is not JSON: {err}"
                                    ) from None
    if not isinstance(entry, dict) or not isinstance(entry.get("metadata"), dict):
        raise ReasoningGymDataError(f"data_source {data_source!r}: extra_info[{ENTRY_KEY!r}] is not a reasoning-gym "
                                    f"entry (a dict with 'question', 'answer' and 'metadata')")
    return entry


def reasoning_gym(data_source: str, solution_str: str, ground_truth: str | None = None,
                  extra_info: dict | None = None) -> float:
    """reasoning-gym's ``score_answer`` of the task that generated the row (the entry's
    ``metadata["source_dataset"]``, else the ``reasoning_gym/<task>`` data_source) on the extracted answer."""
    _package(data_source)
    entry = entry_of(data_source, extra_info)
    task = entry["metadata"].get("source_dataset") or str(data_source).removeprefix(PREFIX)
    return float(score_answer_fn(task)(extract(solution_str), entry))
