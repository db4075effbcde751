"""Tools an agent may call: an OpenAI-style JSON schema each, a call that returns text, and errors that
become observations instead of stopping anything.

Built-ins (:data:`TOOLS`): ``calculator`` (exact arithmetic on integers and decimals with ``+ - * / // %
**`` and parentheses, parsed with :mod:`ast`, nothing evaluated) and ``python`` (a program run in the
sandbox of :mod:`rlplat.utils.sandbox`: time, memory, output and process limits, no network, its own
unprivileged user when started by root). A user's Python function becomes a tool with
:func:`function_tool` (``"my_tools.py:lookup"``): its schema comes from its type hints and docstring.

:func:`call_tool` runs one parsed call and always returns a :class:`ToolResult`: an unknown tool, arguments
that do not fit the schema, a tool that raises or runs out of time give ``status`` ``error`` or
``timeout`` and an observation that says what went wrong, so the model can read it and go on.
"""

from __future__ import annotations

import ast
import inspect
import json
import operator
import re
import threading
import time
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from rlplat.registry import Registry
from rlplat.utils.files import import_object
from rlplat.utils.sandbox import SandboxLimits, run_python


class ToolError(Exception):
    """A tool could not do what it was asked; the message is what the model reads."""


@dataclass(frozen=True)
class ToolCall:
    """One call parsed from the model's output; ``error`` is set when it could not be parsed."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw: str = ""
    error: str | None = None


@dataclass(frozen=True)
class ToolResult:
    status: str  # ok | error | timeout
    observation: str  # what the model reads
    seconds: float


class Tool(ABC):
    """A tool: ``name``, ``description`` and the JSON schema of its arguments (``parameters``); calling it
    with the arguments returns the text the model reads, or raises :class:`ToolError`."""

    name: str
    description: str
    parameters: dict  # {"type": "object", "properties": {...}, "required": [...]}
    timeout_s: float = 30.0  # run_tool's limit for tools that do not enforce their own

    def schema(self) -> dict:
        """The OpenAI-style schema passed to the chat template (``tools=``)."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}

    @abstractmethod
    def __call__(self, **arguments: Any) -> str: ...


TOOLS: Registry[type[Tool]] = Registry("tool")


# ----------------------------------------------------------------------------------------------- calculator
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
        ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_MAX_BITS = 4096  # ~1,233 decimal digits: larger intermediate values are refused, not computed


def exact_value(expression: str) -> Fraction:
    """The exact value of an arithmetic expression of integer and decimal literals, ``+ - * / // % **``
    and parentheses. Anything else (names, calls, attributes, strings, comparisons), division by zero,
    a non-integer or huge exponent, or a value over ~1,200 digits raises :class:`ToolError`."""

    def value(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return Fraction(str(node.value)) if isinstance(node.value, float) else Fraction(node.value)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            inner = value(node.operand)
            return -inner if isinstance(node.op, ast.USub) else inner
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
                raise ToolError("division by zero")
            if isinstance(node.op, ast.Pow):
                if right.denominator != 1 or abs(right) > 10_000 or \
                        max(left.numerator.bit_length(), left.denominator.bit_length()) * abs(right) > _MAX_BITS:
                    raise ToolError("the exponent must be a whole number and the result under ~1,200 digits")
                right = int(right)
            result = _OPS[type(node.op)](left, right)
            result = Fraction(result)
            if max(result.numerator.bit_length(), result.denominator.bit_length()) > _MAX_BITS:
                raise ToolError("a value over ~1,200 digits")
            return result
        raise ToolError(f"only numbers, + - * / // % ** and parentheses are allowed, not {type(node).__name__}")

    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ToolError(f"not an arithmetic expression: {err.msg}") from None
    except RecursionError:
        raise ToolError("the expression is nested too deeply") from None
    try:
        return value(tree.body)
    except RecursionError:
        raise ToolError("the expression is nested too deeply") from None


def format_value(number: Fraction) -> str:
    """An integer as its digits; a fraction exactly (``7/3``) with its decimal value to 12 digits."""
    if number.denominator == 1:
        return str(number.numerator)
    return f"{number.numerator}/{number.denominator} (= {float(number):.12g})"


@TOOLS.register("calculator")
class Calculator(Tool):
    name = "calculator"
    description = "Evaluate an arithmetic expression exactly, e.g. 123456 * 789 or (2 + 3) ** 4 / 7."
    parameters = {"type": "object", "required": ["expression"],
                  "properties": {"expression": {"type": "string",
                                                "description": "numbers, + - * / // % ** and parentheses"}}}

    def __call__(self, expression: str) -> str:
        return format_value(exact_value(expression))


# --------------------------------------------------------------------------------------------------- python
@TOOLS.register("python")
class PythonTool(Tool):
    """Runs the model's program in the sandbox and returns what it printed (stdout, then stderr),
    truncated to ``max_output_chars``."""

    name = "python"
    description = ("Run a Python program and return what it prints. Only the standard library; no network, "
                   "no files outside its own directory; print the results you need.")
    parameters = {"type": "object", "required": ["code"],
                  "properties": {"code": {"type": "string", "description": "a complete Python program"}}}

    def __init__(self, limits: SandboxLimits = SandboxLimits(timeout_s=10.0), max_output_chars: int = 2000):
        self.limits, self.max_output_chars = limits, max_output_chars
        self.timeout_s = limits.timeout_s + 10.0  # the sandbox enforces limits.timeout_s itself

    def _clip(self, text: str) -> str:
        limit = self.max_output_chars
        return text if len(text) <= limit else text[:limit] + f"\n... [{len(text) - limit} more characters cut]"

    def __call__(self, code: str) -> str:
        result = run_python(code, "", self.limits)
        output = result.stdout + (("\n" if result.stdout else "") + result.stderr if result.stderr else "")
        if result.status == "timeout":
            raise TimeoutError(f"the program ran out of time ({self.limits.timeout_s:g} s); output so far:\n"
                               f"{self._clip(output)}")
        if not result.ok:
            raise ToolError(f"{result.describe()}:\n{self._clip(output)}")
        return self._clip(output)


# ------------------------------------------------------------------------------------------- user functions
_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean", list: "array", dict: "object"}
_ARG_LINE = re.compile(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.+)$")


def _json_type(hint: Any) -> str | None:
    origin = typing.get_origin(hint) or hint
    return _JSON_TYPES.get(origin)


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """The description (the text before an ``Args:`` section) and each argument's line from that section."""
    doc = inspect.cleandoc(doc or "")
    section = re.search(r"^(?:Args|Arguments|Parameters):\s*$", doc, flags=re.M)
    head, args = (doc[:section.start()], doc[section.end():]) if section else (doc, "")
    described = {}
    for line in args.splitlines():
        if match := _ARG_LINE.match(line):
            described[match.group(1)] = match.group(2).strip()
    return " ".join(head.split()), described


class FunctionTool(Tool):
    """A Python function as a tool: the schema from its signature (type hints -> JSON types; parameters
    without a default are required) and docstring (the text before ``Args:`` describes the tool; the
    ``name: text`` lines under it describe the arguments). It runs in the calling process, in a thread
    given ``timeout_s``: past it the call is reported as timed out (the thread cannot be stopped and
    finishes in the background, so a tool that can hang should enforce its own limit)."""

    def __init__(self, fn: Callable, name: str | None = None, timeout_s: float = 30.0):
        self.fn, self.name, self.timeout_s = fn, name or fn.__name__, timeout_s
        description, described = _docstring_parts(fn.__doc__ or "")
        self.description = description or self.name
        hints = typing.get_type_hints(fn)
        properties, required = {}, []
        for param in inspect.signature(fn).parameters.values():
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                continue
            spec: dict[str, Any] = {}
            if (kind := _json_type(hints.get(param.name))) is not None:
                spec["type"] = kind
            if param.name in described:
                spec["description"] = described[param.name]
            properties[param.name] = spec
            if param.default is inspect.Parameter.empty:
                required.append(param.name)
        self.parameters = {"type": "object", "properties": properties, "required": required}

    def __call__(self, **arguments: Any) -> str:
        return observation_text(self.fn(**arguments))


def observation_text(value: Any) -> str:
    """What the model reads of a tool's return value: a string as it is; a dict, list, number, bool or None as
    JSON (as tool results are shown in chat templates' examples), anything else as ``str``."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(value)


def load_object(spec: str, kind: str) -> Any:
    """The object named ``"path/to/file.py:name"`` or ``"package.module:name"``; a ``ValueError`` naming the
    ``kind`` ("tool", "environment"), the spec and what is wrong otherwise."""
    try:
        return import_object(spec, f"rlplat_user_{kind}")
    except ValueError as err:
        raise ValueError(f"{kind} {spec!r}: {err}") from None


def function_tool(spec: str) -> FunctionTool:
    """``"path/to/file.py:function"`` or ``"module:function"`` as a :class:`FunctionTool` (errors as
    :func:`load_object`'s)."""
    fn = load_object(spec, "tool")
    if not callable(fn):
        raise ValueError(f"tool {spec!r}: {fn!r} is not a function")
    return FunctionTool(fn)


# ------------------------------------------------------------------------------------------------ a call
def _check_arguments(tool: Tool, arguments: Mapping[str, Any]) -> None:
    schema = tool.parameters
    properties = schema.get("properties", {})
    missing = [name for name in schema.get("required", []) if name not in arguments]
    unknown = [name for name in arguments if name not in properties]
    if missing or unknown:
        raise ToolError(f"{tool.name} takes {sorted(properties)}" + (f"; missing {missing}" if missing else "")
                        + (f"; unknown {unknown}" if unknown else ""))
    python = {v: k for k, v in _JSON_TYPES.items()}
    for name, value in arguments.items():
        kind = properties[name].get("type")
        expected = python.get(kind)
        if expected is not None and not (isinstance(value, expected) and not (expected is int and isinstance(value, bool))):
            if not (expected is float and isinstance(value, int) and not isinstance(value, bool)):
                raise ToolError(f"{tool.name}: argument {name!r} must be {kind}, got {type(value).__name__}")


def call_tool(call: ToolCall, tools: Mapping[str, Tool]) -> ToolResult:
    """Run one parsed call; every failure is a result the model reads (see the module doc)."""
    start = time.perf_counter()

    def done(status: str, observation: str) -> ToolResult:
        return ToolResult(status, observation, time.perf_counter() - start)

    if call.error is not None:
        return done("error", f"error: {call.error}")
    tool = tools.get(call.name)
    if tool is None:
        return done("error", f"error: no tool named {call.name!r}; the tools are {sorted(tools)}")
    try:
        _check_arguments(tool, call.arguments)
    except ToolError as err:
        return done("error", f"error: {err}")
    outcome: dict[str, Any] = {}

    def work() -> None:
        try:
            outcome["text"] = tool(**call.arguments)
        except BaseException as err:  # the tool's failure is the model's observation
            outcome["error"] = err

    thread = threading.Thread(target=work, name=f"rlplat-tool-{tool.name}", daemon=True)
    thread.start()
    thread.join(tool.timeout_s)
    if thread.is_alive():
        return done("timeout", f"error: {tool.name} did not finish within {tool.timeout_s:g} s")
    error = outcome.get("error")
    if isinstance(error, TimeoutError):
        return done("timeout", f"error: {error}")
    if isinstance(error, ToolError):
        return done("error", f"error: {error}")
    if error is not None:
        return done("error", f"error: {tool.name} raised {type(error).__name__}: {error}")
    return done("ok", observation_text(outcome.get("text", "")))
