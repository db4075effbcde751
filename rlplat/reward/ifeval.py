"""Instruction following: does a response follow its prompt's verifiable instructions ("answer in fewer than 50
words", "wrap the title in << >>", "end with 'Is there anything else?'")?

The checks are IFEval's (Zhou et al., 2023, "Instruction-Following Evaluation for Large Language Models",
arXiv:2311.07911), as lm-evaluation-harness implements them (``lm_eval.tasks.ifeval``: its 25 instruction types
and its strict verdict, ``test_instruction_following_strict``). The row format and the score are open-instruct's
RLVR-IF verifier's (``IFEvalVerifier``): ``reward_model.ground_truth`` holds the instruction ids and their
arguments, ``{"instruction_id": [...], "kwargs": [{...}, ...]}`` (also as its JSON, or as open-instruct's string of
a one-element list of it; IFEval's own ``instruction_id_list`` is read too), the thinking before ``</think>`` and
``<answer>`` tags are removed from the response, and the score is the fraction of instructions followed (``acc``:
all of them).

Two types, ``length_constraints:number_sentences`` and ``change_case:capital_word_frequency``, split sentences
with nltk's ``punkt_tab`` data, which is downloaded apart from the package (``python -m nltk.downloader
punkt_tab``); rlplat never downloads at run time, so without it a row with one of them is a failed reward call
that says so. Install: ``pip install -e '.[ifeval]'``.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import io
import json
from typing import Any

NEEDS_PUNKT = ("length_constraints:number_sentences", "change_case:capital_word_frequency")


@functools.cache
def reference():
    """lm-evaluation-harness's IFEval modules ``(instructions_registry, utils)``, imported once. Its import asks
    nltk to download ``punkt_tab`` when missing; rlplat keeps a run off the network, so the download is skipped
    (:data:`NEEDS_PUNKT` then fail with the command that installs it). langdetect (the language and case checks)
    is seeded, as its documentation advises for repeatable results."""
    try:
        import nltk
    except ModuleNotFoundError:
        raise ModuleNotFoundError("the ifeval reward needs lm-eval, nltk, langdetect and immutabledict: "
                                  "pip install -e '.[ifeval]'") from None
    download, nltk.download = nltk.download, (lambda *args, **kwargs: False)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # its "Downloaded punkt_tab" line, printed either way
            from lm_eval.tasks.ifeval import instructions_registry, utils
    except ModuleNotFoundError as missing:
        raise ModuleNotFoundError(f"the ifeval reward needs lm-eval ({missing}): pip install -e '.[ifeval]'") from None
    finally:
        nltk.download = download
    import langdetect

    langdetect.DetectorFactory.seed = 0  # its language guess samples at random: the same text, the same verdict
    return instructions_registry, utils


def constraints(ground_truth: Any) -> tuple[list[str], list[dict]]:
    """The instruction ids and each one's arguments (None dropped) from a row's ground truth, in any of the
    forms the module docstring names; ValueError naming what is wrong."""
    value = ground_truth
    for _ in range(3):  # a string of a list of a JSON string of the dict: open-instruct's rows nest that deep
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError:
                try:
                    value = ast.literal_eval(value)
                except (ValueError, SyntaxError):
                    raise ValueError(f"ifeval: ground truth {value[:80]!r} is neither JSON nor a Python literal of "
                                     "{'instruction_id': [...], 'kwargs': [...]}") from None
        if isinstance(value, (list, tuple)) and len(value) == 1:
            value = value[0]
    if not isinstance(value, dict):
        raise ValueError(f"ifeval: ground truth {str(ground_truth)[:80]!r} is not {{'instruction_id': [...], "
                         "'kwargs': [...]}")
    ids = value.get("instruction_id", value.get("instruction_id_list"))
    kwargs = value.get("kwargs") or [None] * len(ids or [])
    if not isinstance(ids, (list, tuple)) or not ids or len(kwargs) != len(ids):
        raise ValueError(f"ifeval: ground truth needs a non-empty 'instruction_id' list and one 'kwargs' entry per "
                         f"id; got {str(value)[:120]}")
    known = reference()[0].INSTRUCTION_DICT
    if unknown := [iid for iid in ids if iid not in known]:
        raise ValueError(f"ifeval: unknown instruction id {unknown[0]!r}; IFEval's are {', '.join(sorted(known))}")
    return list(ids), [{k: v for k, v in (args or {}).items() if v is not None} for args in kwargs]


def answer_of(response: str) -> str:
    """The response without its thinking (everything up to the last ``</think>``) and ``<answer>`` tags."""
    answer = response.replace("<|assistant|>", "").strip().split("</think>")[-1]
    return answer.replace("<answer>", "").replace("</answer>", "").strip()


def followed(ground_truth: Any, response: str, prompt: str = "") -> list[bool]:
    """Whether the response follows each instruction of ``ground_truth`` (IFEval's strict verdict on
    :func:`answer_of` the response); ``prompt`` is the prompt's text (an instruction to repeat it reads it)."""
    ids, kwargs = constraints(ground_truth)
    _, utils = reference()
    example = utils.InputExample(key=0, instruction_id_list=ids, prompt=prompt, kwargs=kwargs)
    try:
        return list(utils.test_instruction_following_strict(example, answer_of(response)).follow_instruction_list)
    except LookupError:
        needing = [iid for iid in ids if iid in NEEDS_PUNKT]
        raise RuntimeError(f"ifeval: {', '.join(needing) or 'an instruction'} splits sentences with nltk's "
                           "punkt_tab data, which is not installed: python -m nltk.downloader punkt_tab") from None


def ifeval(data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None,
           prompt: Any = None) -> dict[str, float]:
    """The fraction of the row's instructions the response follows (``acc``: 1.0 when it follows all)."""
    text = ""
    if isinstance(prompt, (list, tuple)):  # chat messages: the last user turn holds the instructions
        text = next((str(m.get("content", "")) for m in reversed(prompt) if m.get("role") == "user"), "")
    verdicts = followed(ground_truth, solution_str, text)
    return {"score": sum(verdicts) / len(verdicts), "acc": float(all(verdicts)), "instructions": float(len(verdicts))}
