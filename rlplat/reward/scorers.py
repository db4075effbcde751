"""Rule-based reward functions, one signature for all:
``fn(data_source, solution_str, ground_truth, extra_info) -> float``.

Scorers never raise on odd model text (they return 0.0) and never ``eval`` it. ``auto`` picks the
scorer from the row's ``data_source``.
"""

from __future__ import annotations

import ast
import importlib.util
import operator
import re
from collections.abc import Callable
from pathlib import Path

from rlplat.registry import Registry

RewardFn = Callable[..., float]
REWARD_FUNCTIONS: Registry[RewardFn] = Registry("reward function")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


class UnknownDataSourceError(ValueError):
    """``auto`` has no scorer for a data_source: a configuration problem, not a sample's."""


def _last_answer(text: str) -> str:
    found = _ANSWER.findall(text)
    return found[-1] if found else text


@REWARD_FUNCTIONS.register("arithmetic")
def arithmetic(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 if the response (optionally inside ``<answer>…</answer>``) is exactly the integer answer."""
    return 1.0 if _last_answer(solution_str).strip() == str(ground_truth).strip() else 0.0


_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _safe_eval(node: ast.AST) -> float:
    """Evaluate + - * / over integer literals only; anything else raises ValueError."""
    if isinstance(node, ast.Expression):
        return _safe_eval(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_safe_eval(node.left), _safe_eval(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_safe_eval(node.operand)
    raise ValueError(f"disallowed expression element {type(node).__name__}")


@REWARD_FUNCTIONS.register("countdown")
def countdown(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 for an expression (in the last ``<answer>`` if any) that uses each of ``extra_info["numbers"]``
    exactly once and equals the target; 0.1 for a well-formed but wrong one (format credit, as the
    TinyZero countdown scorer gives); 0.0 otherwise."""
    expr = _last_answer(solution_str).strip()
    if not expr or not re.fullmatch(r"[\d+\-*/() ]+", expr):
        return 0.0
    try:
        value = _safe_eval(ast.parse(expr, mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return 0.0
    info = extra_info or {}
    numbers = sorted(int(n) for n in info.get("numbers", []))
    used = sorted(int(n) for n in re.findall(r"\d+", expr))
    target = float(info.get("target", ground_truth))
    return 1.0 if used == numbers and abs(value - target) < 1e-6 else 0.1


def _number(text: str) -> float | None:
    text = text.replace(",", "").replace("$", "").strip().rstrip(".")
    try:
        return float(text)
    except ValueError:
        return None


@REWARD_FUNCTIONS.register("gsm8k")
def gsm8k(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 if the number after the last ``####`` equals the ground truth (commas and $ ignored)."""
    found = re.findall(r"####\s*([-$\d.,]+)", solution_str)
    if not found:
        return 0.0
    answer, truth = _number(found[-1]), _number(str(ground_truth))
    return 1.0 if answer is not None and truth is not None and abs(answer - truth) < 1e-6 else 0.0


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (nested braces handled), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i + 1 : j]
    return None


def normalize_math(answer: str) -> str:
    text = answer.strip()
    for old, new in (("\\left", ""), ("\\right", ""), ("\\!", ""), ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"),
                     ("^{\\circ}", ""), ("^\\circ", ""), ("\\$", ""), ("$", ""), (" ", "")):
        text = text.replace(old, new)
    text = re.sub(r"\\text\{(.*?)\}", r"\1", text)
    text = re.sub(r"^[a-zA-Z]=", "", text)
    return text.rstrip(".")


def _math_value(text: str) -> float | None:
    frac = re.fullmatch(r"\\frac\{(-?\d+)\}\{(-?\d+)\}|(-?\d+)/(-?\d+)", text)
    if frac:
        num, den = (int(g) for g in (frac.group(1, 2) if frac.group(1) else frac.group(3, 4)))
        return num / den if den else None
    return _number(text)


@REWARD_FUNCTIONS.register("math")
def math_boxed(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 if the last ``\\boxed{}`` equals the ground truth after normalisation (as strings, or as
    numbers when both parse, fractions included)."""
    boxed = last_boxed(solution_str)
    if boxed is None:
        return 0.0
    answer, truth = normalize_math(boxed), normalize_math(str(ground_truth))
    if answer == truth:
        return 1.0
    a, t = _math_value(answer), _math_value(truth)
    return 1.0 if a is not None and t is not None and abs(a - t) < 1e-6 else 0.0


_FORMAT = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)


@REWARD_FUNCTIONS.register("format")
def format_reward(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """1.0 if the response is ``<think>…</think><answer>…</answer>`` and nothing else."""
    return 1.0 if _FORMAT.match(solution_str) else 0.0


def scorer_for(data_source: str) -> RewardFn:
    if data_source == "rlplat/arithmetic":
        return arithmetic
    if data_source == "rlplat/countdown":
        return countdown
    if data_source in ("openai/gsm8k", "gsm8k"):
        return gsm8k
    if "math" in data_source.lower():
        return math_boxed
    raise UnknownDataSourceError(
        f"no reward function for data_source {data_source!r}; known: rlplat/arithmetic, rlplat/countdown, "
        f"openai/gsm8k, *math*; set reward.functions or reward.custom_fn.path"
    )


@REWARD_FUNCTIONS.register("auto")
def auto(data_source: str, solution_str: str, ground_truth: str, extra_info: dict | None = None) -> float:
    """The built-in scorer for the row's data_source."""
    return scorer_for(data_source)(data_source, solution_str, ground_truth, extra_info)


def load_custom_function(path: str, name: str) -> RewardFn:
    """Import ``name`` from the Python file ``path`` (``reward.custom_fn.path`` / ``.name``)."""
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"reward.custom_fn.path={path!r}: no such file")
    spec = importlib.util.spec_from_file_location(f"rlplat_custom_reward_{abs(hash(file.resolve()))}", file)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        raise ImportError(f"reward.custom_fn.path={path!r} failed to import: {type(err).__name__}: {err}") from err
    fn = getattr(module, name, None)
    if fn is None:
        defined = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise AttributeError(f"reward.custom_fn.name={name!r} is not defined in {path}; it defines: {defined}")
    if not callable(fn):
        raise TypeError(f"reward.custom_fn.name={name!r} in {path} is not callable")
    return fn
