"""Are two math answers equal? rlplat's normal form first, then Hugging Face's ``math-verify``.

    math_equal(answer, truth):
      1. both through :func:`normalize_math`; equal strings, or equal exact numbers (``0.5`` = ``1/2`` =
         ``\\frac{1}{2}``, ``1{,}000`` = ``1000``) -> True
      2. both plain words (``Tuesday``, ``\\text{even}``) -> compared as words, case-insensitively, and
         nothing else (a symbolic parser would read a word as a product of letters, so anagrams would match)
      3. otherwise ``math_verify.verify(parse(truth), parse(answer))``: symbolic equivalence with sympy —
         sets and solution lists in any order, tuples and intervals with mixed number forms, radicals,
         ``\\pi``, matrices, units, answer choices, labelled answers (``AB = 10``), ``x = 1 \\text{ or } x = -2``.

math-verify's own time limits use ``SIGALRM``, which only works in a process's main thread, so they are off
here: the time limit of a comparison is the reward call's (``reward.timeout_s``, enforced by the reward
pool, which replaces a process stuck in sympy). With ``reward.isolation=inprocess`` there is none.
"""

from __future__ import annotations

import functools
import logging
import re
from fractions import Fraction

_DECIMAL = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)")  # no exponent: "1e999999999" must not build a huge int
_THOUSANDS = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
_FRACTION = re.compile(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}|(-?\d+)/(-?\d+)")
_WORD = re.compile(r"[A-Za-z]{2,}(?: [A-Za-z]+)*")
_MATH_REMOVE = ("\\!", "\\,", "\\;", "\\:", "^{\\circ}", "^\\circ", "°", "\\$", "$", "\\%", "%", "{,}")


def exact_number(text: str) -> Fraction | None:
    """A plain decimal (``-12``, ``3.50``, ``.5``) as an exact fraction, or None."""
    if not _DECIMAL.fullmatch(text):
        return None
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):  # e.g. more digits than int() accepts from a string
        return None


def braced(text: str, open_at: int) -> str | None:
    """The content of the ``{...}`` group opening at ``text[open_at]``, nested braces included."""
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : j]
    return None


_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``; spaces before the brace allowed), nested
    braces handled; None when there is none or it is not closed."""
    found = list(_BOXED.finditer(text))
    return braced(text, found[-1].end() - 1) if found else None


def _unwrap(text: str, command: str) -> str:
    """``\\command{content}`` -> ``content`` everywhere, nested braces included."""
    token = "\\" + command + "{"
    while (start := text.find(token)) >= 0:
        inner = braced(text, start + len(token) - 1)
        if inner is None:
            break
        text = text[:start] + inner + text[start + len(token) + len(inner) + 1 :]
    return text


def normalize_math(answer: str) -> str:
    """Canonical string form of a MATH-style answer.

    Unwraps ``\\text{}``, ``\\textbf{}``, ``\\mathrm{}``, ``\\mbox{}``; drops ``\\left``/``\\right``, thin
    spaces (``\\! \\, \\; \\:``), degrees (``^{\\circ}``), dollars and percent signs, ``{,}`` digit
    separators, all whitespace, a trailing ``.`` and a leading ``x=`` (any single-letter variable);
    ``\\dfrac``/``\\tfrac`` -> ``\\frac``, ``\\frac12`` -> ``\\frac{1}{2}``, ``\\sqrt2`` -> ``\\sqrt{2}``,
    the Unicode minus ``−`` -> ``-``.
    """
    text = answer.replace("\u2212", "-")
    for command in ("text", "textbf", "mathrm", "mbox"):
        text = _unwrap(text, command)
    text = re.sub(r"\\(?:left|right)(?![a-zA-Z])", "", text)  # keeps \rightarrow intact
    for token in _MATH_REMOVE:
        text = text.replace(token, "")
    text = re.sub(r"\s+", "", text).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    text = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", text)
    text = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", text)
    text = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", text)
    text = re.sub(r"^[a-zA-Z]=", "", text)
    return text.rstrip(".")


def math_value(text: str) -> Fraction | None:
    """A normalised answer as an exact number: decimals, ``1,000``, ``a/b``, ``\\frac{a}{b}``; else None."""
    if _THOUSANDS.fullmatch(text):
        text = text.replace(",", "")
    fraction = _FRACTION.fullmatch(text)
    if not fraction:
        return exact_number(text)
    sign, num, den = (fraction.group(1), *fraction.group(2, 3)) if fraction.group(2) else ("", *fraction.group(4, 5))
    if int(den) == 0:
        return None
    return Fraction(int(num), int(den)) * (-1 if sign else 1)


def _word(answer: str) -> str | None:
    """The answer as a plain lower-case word or phrase (``\\text{Tuesday}`` -> ``tuesday``), else None."""
    text = answer
    for command in ("text", "textbf", "mathrm", "mbox"):
        text = _unwrap(text, command)
    text = " ".join(text.strip().rstrip(".").split())
    return text.lower() if _WORD.fullmatch(text) else None


def math_equal(answer: str, truth: str) -> bool:
    """Whether the answer ``answer`` equals ``truth`` (both LaTeX without ``\\boxed``); see the module doc."""
    normal_answer, normal_truth = normalize_math(answer), normalize_math(truth)
    if not normal_answer:
        return False
    if normal_answer == normal_truth:
        return True
    value = math_value(normal_answer)
    if value is not None and value == math_value(normal_truth):
        return True
    word_answer, word_truth = _word(answer), _word(truth)
    if word_answer is not None or word_truth is not None:
        return word_answer == word_truth
    return _verify(answer, truth)


@functools.lru_cache(maxsize=1)
def _math_verify():
    """math-verify's ``parse`` and ``verify``, imported on first use (sympy takes ~0.4 s to import); its
    warning that the time limits are off is silenced: they are ours (see the module doc)."""
    import math_verify

    for name in ("math_verify", "latex2sympy2_extended"):
        logging.getLogger(name).setLevel(logging.ERROR)
    return math_verify.parse, math_verify.verify


@functools.lru_cache(maxsize=4096)
def _parsed(latex: str) -> tuple:
    """math-verify's parse of ``$latex$`` (cached: a group's samples share one ground truth)."""
    parse, _ = _math_verify()
    return tuple(parse(f"${latex}$", parsing_timeout=None))


def _verify(answer: str, truth: str) -> bool:
    _, verify = _math_verify()
    gold, target = _parsed(truth), _parsed(answer)
    if not gold or not target:
        return False
    return bool(verify(list(gold), list(target), timeout_seconds=None))
