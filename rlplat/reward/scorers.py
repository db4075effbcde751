"""Rule-based reward functions, one signature for all::

    fn(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None) -> float

``solution_str`` is the decoded response (model text), ``ground_truth`` the row's
``reward_model.ground_truth`` and ``extra_info`` its ``extra_info`` dict. Scorers never raise on odd model
text (they return 0.0) and never ``eval`` it; they do raise on bad *data* (e.g. a countdown row without
``extra_info["numbers"]``), which the reward manager counts and reports. ``auto`` picks the scorer from the
row's ``data_source`` and raises :class:`UnknownDataSourceError` (a configuration error) when it has none.

Where they depart from the scorers they imitate (verl / TinyZero / Hendrycks MATH):

* ``countdown`` parses with :mod:`ast` instead of ``eval``; a syntactically valid expression that cannot be
  evaluated (division by zero) gets 0.0, not TinyZero's format credit.
* ``gsm8k`` and ``math`` compare numbers exactly as fractions (``0.5 == 1/2``), not with a float tolerance;
  ``math`` then compares symbolically with math-verify (:mod:`rlplat.reward.equivalence`).
"""

from __future__ import annotations

import ast
import fnmatch
import inspect
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from rlplat.registry import Registry
from rlplat.utils.files import import_file
from rlplat.reward.code import CodeScorer
from rlplat.reward.errors import UnknownDataSourceError
from rlplat.reward.ifeval import ifeval
from rlplat.reward.reasoning_gym import reasoning_gym
from rlplat.reward.equivalence import exact_number, last_boxed, math_equal

RewardFn = Callable[[str, str, str, "dict | None"], float]
REWARD_FUNCTIONS: Registry[RewardFn] = Registry("reward function")

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


# ---------------------------------------------------------------------------------------------- arithmetic
# End-of-text markers a decoder leaves in the text when it does not skip special tokens.
END_MARKERS = ("<|endoftext|>", "<|im_end|>", "<|eot_id|>", "<|end_of_text|>", "<|end|>", "</s>", "<eos>")
_WRAPPED = re.compile(r"<answer>(.*)</answer>", re.DOTALL)


def _strip_end_markers(text: str) -> str:
    text = text.strip()
    while text.endswith(END_MARKERS):
        text = text[: -len(next(m for m in END_MARKERS if text.endswith(m)))].rstrip()
    return text


@REWARD_FUNCTIONS.register("arithmetic")
def arithmetic(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 if the response is exactly the ground-truth integer, else 0.0.

    Accepted: the integer's digits (``"-7"``, not ``"-07"`` or ``"+7"``; a ground truth ``"122.0"`` means 122),
    surrounded by any whitespace, optionally followed by end-of-text markers (:data:`END_MARKERS`), and
    optionally wrapped as a whole in ``<answer>…</answer>``. Anything else, e.g. ``"12 because"``, is 0.0.
    """
    text = _strip_end_markers(solution_str)
    wrapped = _WRAPPED.fullmatch(text)
    if wrapped:
        text = wrapped.group(1).strip()
    truth = str(ground_truth).strip()
    number = exact_number(truth)
    if number is not None and number.denominator == 1:  # "122.0" (a float column) is the integer 122
        truth = str(number.numerator)
    return 1.0 if text == truth else 0.0


# ----------------------------------------------------------------------------------------------- countdown
_BINARY_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_UNARY_OPS = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_EXPRESSION_ALPHABET = re.compile(r"[0-9+\-*/() ]+")


def safe_arithmetic(expression: str) -> int | float:
    """Value of ``expression`` built only from integer literals, ``+ - * /`` and parentheses.

    Parsed with :mod:`ast`; names, calls, attributes, ``**``, ``//`` and every other node raise
    ``ValueError``, so nothing in the text is ever executed. Division by zero raises ``ZeroDivisionError``.
    """

    def value(node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPS:
            return _BINARY_OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPS:
            return _UNARY_OPS[type(node.op)](value(node.operand))
        raise ValueError(f"disallowed expression element {type(node).__name__}")

    return value(ast.parse(expression, mode="eval").body)


def _last_answer(text: str) -> str:
    found = _ANSWER.findall(text)
    return found[-1] if found else text


def _countdown_task(ground_truth: str, extra_info: dict | None) -> tuple[list[int], float]:
    info = extra_info or {}
    if info.get("numbers") is None:
        raise ValueError("countdown needs extra_info['numbers'] (the numbers to use) in every row")
    target = info.get("target", ground_truth)
    return sorted(int(n) for n in info["numbers"]), float(target)


@REWARD_FUNCTIONS.register("countdown")
def countdown(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 for an expression that uses each of ``extra_info["numbers"]`` exactly once and equals
    ``extra_info["target"]`` (``ground_truth`` when absent) within 1e-6; 0.1 for a well-formed but wrong
    one (format credit, as the TinyZero countdown scorer gives); 0.0 otherwise.

    The expression is the content of the last ``<answer>…</answer>``, or the whole response when there is
    none, stripped at both ends. Well-formed: only digits, ``+ - * /``, parentheses and spaces, and it
    parses and evaluates (:func:`safe_arithmetic`; intermediate values may be fractions). Not well-formed,
    so 0.0: ``=``, letters, ``**``, division by zero, a syntax error.
    """
    numbers, target = _countdown_task(ground_truth, extra_info)
    expression = _last_answer(solution_str).strip()
    if not _EXPRESSION_ALPHABET.fullmatch(expression):
        return 0.0
    try:
        value = safe_arithmetic(expression)
        correct = abs(value - target) < 1e-6  # int -> float may overflow for absurd literals
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, RecursionError, MemoryError):
        return 0.0
    used = sorted(int(n) for n in re.findall(r"[0-9]+", expression))
    return 1.0 if correct and used == numbers else 0.1


# --------------------------------------------------------------------------------------------------- gsm8k
# A number: digits with optional thousands commas and decimals, not glued to a word ("12abc", "1e9", "x2").
_NUMBER = re.compile(r"(?<![\w.])(-?)(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?![\w])")
_MARKUP = re.compile(r"\*\*|__|\\boxed\s*\{|\\text\s*\{|\\\(|\\\)|[{}]")
_DOLLAR = re.compile(r"\\?\$")
_HEADING = re.compile(r"[ \t]*[A-Za-z]")  # what follows a line-start "####" that makes it a markdown heading


def _numbers(text: str) -> list[Fraction]:
    """The numbers in ``text`` in order, as exact fractions; markdown bold, dollars, ``\\boxed{}`` and
    ``\\text{}`` around them are ignored (``**$1,234**`` is 1234)."""
    clean = _MARKUP.sub(" ", _DOLLAR.sub("", text.replace("\u2212", "-")))
    found = (exact_number(sign + digits.replace(",", "")) for sign, digits in _NUMBER.findall(clean))
    return [n for n in found if n is not None]


def _answer_marker_line(text: str) -> str | None:
    """The text after the answer's ``####`` up to the end of its line: the last ``####`` that is not a
    markdown heading (a ``####`` starting a line, followed by words without the word "answer")."""
    for found in reversed(list(re.finditer("####", text))):
        line = text[found.end():].split("\n", 1)[0]
        at_line_start = found.start() == 0 or text[found.start() - 1] == "\n"
        if at_line_start and _HEADING.match(line) and "answer" not in line.lower():
            continue
        return line
    return None


def _gsm8k_truth(ground_truth: str) -> Fraction | None:
    truth = str(ground_truth).rpartition("####")[2]  # a full GSM8K solution as ground truth works too
    return exact_number(truth.strip().replace(",", "").replace("$", "").rstrip("."))


@REWARD_FUNCTIONS.register("gsm8k")
def gsm8k(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 if the first number on the answer's ``####`` line equals the ground truth, else 0.0 (strict mode).

    The answer's ``####`` is the last one that is not a markdown heading (``#### Check`` at the start of a
    line after the answer; a line that says "answer", ``#### The answer is 18``, is not a heading). On its
    line: optional words, then a number with optional ``-``, ``$``/``\\$``, commas and decimals, bold or
    ``\\boxed{}`` around it (``#### **18**``, ``#### \\$1,234.00``, ``#### \\boxed{18}``); a number glued to
    a letter (``#### 12abc``, ``#### 1e9``) is not one. Compared exactly as fractions, so ``72.0`` equals
    ``72``. No ``####``, or no number on its line: 0.0. A ground truth that is a full GSM8K solution counts
    by its own ``####`` answer. ``gsm8k_flexible`` takes the response's last number instead.
    """
    line = _answer_marker_line(solution_str)
    numbers = _numbers(line) if line is not None else []
    return 1.0 if numbers and numbers[0] == _gsm8k_truth(ground_truth) else 0.0


@REWARD_FUNCTIONS.register("gsm8k_flexible")
def gsm8k_flexible(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 if the LAST number anywhere in the response equals the ground truth, else 0.0 (verl's
    ``flexible`` mode: for models that do not write ``####``). Numbers as in :func:`gsm8k`."""
    numbers = _numbers(solution_str)
    return 1.0 if numbers and numbers[-1] == _gsm8k_truth(ground_truth) else 0.0


# ---------------------------------------------------------------------------------------------------- math
@REWARD_FUNCTIONS.register("math")
def math_boxed(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 if the content of the LAST ``\\boxed{}`` equals the ground truth, else 0.0.

    Equality is :func:`~rlplat.reward.equivalence.math_equal`: rlplat's normal form and exact numbers
    first, then math-verify's symbolic comparison (units, sets in any order, tuples, radicals, matrices,
    choices, labelled answers, ...). A ground truth that is itself a full solution with a ``\\boxed{}`` is
    reduced to its boxed answer first. An unclosed or empty box scores 0.0.
    """
    boxed = last_boxed(solution_str)
    if boxed is None:
        return 0.0
    truth = str(ground_truth)
    return 1.0 if math_equal(boxed, last_boxed(truth) or truth) else 0.0


# -------------------------------------------------------------------------------------------------- format
_FORMAT = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)


@REWARD_FUNCTIONS.register("format")
def format_reward(data_source: str, solution_str: str, ground_truth: str | None = None,
                  extra_info: dict | None = None) -> float:
    """1.0 if the whole response is ``<think>…</think>`` then ``<answer>…</answer>`` (whitespace around and
    between allowed, nothing else), else 0.0. The ground truth is not looked at (prompt-only rows score)."""
    return 1.0 if _FORMAT.fullmatch(solution_str) else 0.0


# ---------------------------------------------------------------------------------------- model-computed
class ModelRewardFunction:
    """A ``reward.functions`` entry whose values a model computes (``reward_model``: a learned reward model;
    ``judge``: an LLM judge, or its server): :func:`rlplat.reward.batch.model_outcomes` gets them from the
    scorers the trainer passes in and hands them to :meth:`RewardManager.score` as ``model_outcomes``, and the
    manager weighs, gates and logs them like any function's. Never called itself."""

    def __init__(self, name: str):
        self.__name__ = name
        # a reward model scores (prompt, response) alone; a judge's template may show the row's answer
        self.needs_ground_truth = name == "judge"

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"reward function {self.__name__!r} is computed by the trainer's model workers")

    def __reduce__(self):
        return ModelRewardFunction, (self.__name__,)


REWARD_FUNCTIONS.add("reward_model", ModelRewardFunction("reward_model"))
REWARD_FUNCTIONS.add("judge", ModelRewardFunction("judge"))


# --------------------------------------------------------------------------------------------------- code
CODE = CodeScorer()  # reward.code's defaults; build_reward_manager configures it (CodeScorer.configured)
REWARD_FUNCTIONS.add("code", CODE)


# ------------------------------------------------------------------------------------------------- ifeval
# IFEval's instruction checks from lm-evaluation-harness (rlplat.reward.ifeval); its packages are an extra
REWARD_FUNCTIONS.add_lazy("ifeval", "rlplat.reward.ifeval:ifeval", requires=("lm_eval", "nltk", "langdetect",
                                                                           "immutabledict"),
                          install="pip install -e '.[ifeval]'")


# ------------------------------------------------------------------------------------------ reasoning-gym
# reasoning-gym's own score_answer on rows written by python -m rlplat.data.reasoning_gym (its package: rlplat[envs])
REWARD_FUNCTIONS.add("reasoning_gym", reasoning_gym)


# ------------------------------------------------------------------------------------ environment-scored
def environment_scored(data_source: str, solution_str: str, ground_truth: str | None = None,
                       extra_info: dict | None = None) -> float:
    """Rows that their agent environment scores (``verifiers/<env>``: its rubric; ``openenv/<env>``: its step
    rewards): 0.0 here, the environment's reward terms add up to the score. A row no environment ran on is a
    configuration error: its reward would be silently 0."""
    if not (extra_info or {}).get("agent"):
        library, _, env = str(data_source).partition("/")
        raise UnknownDataSourceError(
            f"data_source {data_source!r}: these rows are scored by their {library} environment, which did not run "
            f"on them; set rollout.agent.name=tool and rollout.agent.environment={library}:<the environment "
            f"that wrote them, {env!r}>")
    return 0.0


# ---------------------------------------------------------------------------------------------------- auto
AUTO_SOURCES: dict[str, RewardFn] = {  # exact data_source names
    "rlplat/arithmetic": arithmetic,
    "rlplat/tool_arithmetic": arithmetic,  # the final answer after calculator calls: the exact integer
    "rlplat/shapes": arithmetic,  # the count of the shapes in the picture: the exact integer
    "rlplat/countdown": countdown,
    **dict.fromkeys(("openai/gsm8k", "gsm8k", "openai/grade-school-math"), gsm8k),
    **dict.fromkeys(("math", "MATH", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500",
                     "EleutherAI/hendrycks_math", "hendrycks/competition_math", "qwedsacf/competition_math",
                     "math_dapo", "BytedTsinghua-SIA/DAPO-Math-17k", "AI-MO/NuminaMath-CoT", "hiyouga/geometry3k",
                     "AI-MO/aimo-validation-aime", "AI-MO/aimo-validation-amc"), math_boxed),
    **dict.fromkeys(("code", "rlplat/code", "codecontests", "apps", "taco", "codeforces"), CODE),
    **dict.fromkeys(("ifeval", "google/IFEval", "allenai/RLVR-IFeval"), ifeval),  # open-instruct's RLVR-IF rows
}
#: documented name patterns (:mod:`fnmatch`, case-sensitive), tried in order after the exact names
AUTO_PATTERNS: tuple[tuple[str, RewardFn], ...] = (
    ("aime*", math_boxed), ("AIME*", math_boxed), ("*/aime*", math_boxed), ("*/AIME*", math_boxed),  # AIME years
    ("math/*", math_boxed),  # rlplat's own convention for MATH-style subsets: math/algebra, math/level5, ...
    ("numina_*", math_boxed),  # NuminaMath sources as verl writes them: numina_olympiads, numina_amc_aime, ...
    ("code/*", CODE),  # rlplat's convention for code sets: code/mbpp, code/apps, ...
    ("reasoning_gym/*", reasoning_gym),  # python -m rlplat.data.reasoning_gym's rows
    ("verifiers/*", environment_scored),  # python -m rlplat.data.verifiers's rows: the environment's rubric scores
    ("openenv/*", environment_scored),  # rows an OpenEnv environment's rewards score
)


def scorer_for(data_source: str) -> RewardFn:
    """The built-in scorer ``auto`` uses for ``data_source``: an exact name of :data:`AUTO_SOURCES`, else
    the first of :data:`AUTO_PATTERNS` that matches the whole name, else :class:`UnknownDataSourceError`.
    Never a substring test: ``openai/grade-school-math`` is GSM8K, not MATH."""
    if data_source in AUTO_SOURCES:
        return AUTO_SOURCES[data_source]
    for pattern, scorer in AUTO_PATTERNS:
        if isinstance(data_source, str) and fnmatch.fnmatchcase(data_source, pattern):
            return scorer
    known = ", ".join(repr(s) for s in AUTO_SOURCES)
    patterns = ", ".join(repr(p) for p, _ in AUTO_PATTERNS)
    raise UnknownDataSourceError(
        f"no reward function for data_source {data_source!r}; known: {known}; patterns: {patterns}; "
        f"set reward.functions or reward.custom_fn.path"
    )


@dataclass
class AutoScorer:
    """The ``auto`` reward function: the built-in scorer of each row's data_source (:func:`scorer_for`),
    with the ``code`` scorer as ``reward.code`` configures it."""

    code: CodeScorer = field(default_factory=CodeScorer)
    __name__ = "auto"

    def __call__(self, data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None):
        scorer = scorer_for(data_source)
        return (self.code if scorer is CODE else scorer)(data_source, solution_str, ground_truth, extra_info)

    def configured(self, reward_cfg: Any) -> AutoScorer:
        return AutoScorer(self.code.configured(reward_cfg))


REWARD_FUNCTIONS.add("auto", AutoScorer())


# ------------------------------------------------------------------------------------------ custom functions
_KEYS = "reward.custom_fn.path / reward.custom_fn.name"


def _defined_callables(module_name: str, namespace: dict) -> list[str]:
    return sorted(k for k, v in namespace.items()
                  if callable(v) and not k.startswith("_") and getattr(v, "__module__", None) == module_name)


def load_custom_function(path: str, name: str = "compute_score") -> RewardFn:
    """Import the function ``name`` from the Python file ``path`` (``reward.custom_fn.path`` / ``.name``).

    The file is imported as a fresh module (a unique name in ``sys.modules``, so dataclasses and pickling
    inside it work). Every failure names the file and the config keys: a missing file
    (``FileNotFoundError``), an error while importing it (``ImportError`` with the original message), no
    such name (``AttributeError`` listing the functions the file defines), not callable or not callable as
    ``fn(data_source, solution_str, ground_truth, extra_info)`` (``TypeError``).
    """
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"reward.custom_fn.path={path!r}: no such file (resolved to {file.resolve()})")
    try:
        module = import_file(file, "rlplat_custom_reward")
    except BaseException as err:  # SystemExit from a script-style file too; never swallow Ctrl-C
        if isinstance(err, KeyboardInterrupt):
            raise
        raise ImportError(f"reward.custom_fn.path={path!r} failed to import: {type(err).__name__}: {err}") from err
    if not hasattr(module, name):
        defined = _defined_callables(module.__name__, vars(module))
        raise AttributeError(f"reward.custom_fn.name={name!r} is not defined in {path}; it defines: {defined} "
                             f"(set {_KEYS})")
    fn = getattr(module, name)
    if not callable(fn):
        raise TypeError(f"reward.custom_fn.name={name!r} in {path} is not callable "
                        f"(it is a {type(fn).__name__}; set {_KEYS})")
    _check_signature(fn, path, name)
    try:  # lets the reward worker process load the same function from the file
        fn.__rlplat_source__ = (str(file.resolve()), name)
    except (AttributeError, TypeError):  # a builtin or a callable without a __dict__: pickled instead
        pass
    return fn


def _check_signature(fn: Callable, path: str, name: str) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # some builtins have no introspectable signature: trust them
        return
    try:
        signature.bind("data_source", "solution_str", "ground_truth", None)
    except TypeError as err:
        raise TypeError(f"reward.custom_fn.name={name!r} in {path} has signature {name}{signature}, but reward "
                        f"functions are called as fn(data_source, solution_str, ground_truth, extra_info): {err}"
                        ) from None

